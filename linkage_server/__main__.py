from linkage_server.cli import main

main()
