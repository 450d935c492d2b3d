"""The idpool node: per-tag double buffers served over HTTP."""
