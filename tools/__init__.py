"""kernelscout.tools."""
