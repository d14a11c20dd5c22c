from runwire.gateway.main import main

main()
