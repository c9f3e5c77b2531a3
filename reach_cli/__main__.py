from reach_cli.main import main

main()
