from jobwarden.cli.main import main

raise SystemExit(main())
