"""kernelscout: faster GPU kernels for fewer real measurements.

The code lives in the top-level folders agent/, tools/ and sandbox/ of the
repository; they are installed as the subpackages ``kernelscout.agent``,
``kernelscout.tools`` and ``kernelscout.sandbox`` so that nothing generic like
``tools`` lands at the top of site-packages.
"""

__version__ = "0.1.0"
