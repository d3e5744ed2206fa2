"""kernelscout.agent."""
