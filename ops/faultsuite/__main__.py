from ops.faultsuite.runner import main

raise SystemExit(main())
