from spoolctl.cli import main

main()
