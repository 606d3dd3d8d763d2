import BrokerCore

BrokerCommand.main()
