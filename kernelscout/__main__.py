from kernelscout.agent.entry import main

main()
