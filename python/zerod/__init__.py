"""zerod: ZeRO sharding of optimizer state, gradients and parameters under a coordinator daemon.

The PyTorch front end is ``zerod.torch`` (``import zerod.torch as zt``). The native side is the C
library ``libzerod_c.so`` (client/c_api/zerod_c.h): where ``$ZEROD_LIB`` points, else the one
installed inside this package (``pip install --no-build-isolation .``), else the checkout's build
folder when the package runs from python/ in a checkout.
"""

from zerod._native import ZerodError

__all__ = ["ZerodError"]
