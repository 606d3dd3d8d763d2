import BrokerAPI
import BrokerCore

BrokerCommand.main()
