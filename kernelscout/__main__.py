from kernelscout.agent.cli import main

main()
