from mlhpc.cli import main

main()
