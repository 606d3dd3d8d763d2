import AppleSimulator

AppleSimulatorCommand.main()
