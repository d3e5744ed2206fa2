"""kernelscout.prompts."""
