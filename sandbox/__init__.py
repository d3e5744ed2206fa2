"""kernelscout.sandbox."""
