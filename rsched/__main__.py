from rsched.cli.main import main

main()
