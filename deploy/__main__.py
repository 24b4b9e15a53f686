from deploy.commands import main

main()
