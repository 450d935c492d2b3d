"""Operations tooling: process helpers shared with the tests, and the fault suite."""
