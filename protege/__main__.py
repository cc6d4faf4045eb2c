from protege.cli import main

main()
