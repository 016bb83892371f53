"""zerod: ZeRO sharding of optimizer state, gradients and parameters under a coordinator daemon.

The PyTorch front end is ``zerod.torch`` (``import zerod.torch as zt``). The native side is the C
library ``libzerod_c.so`` (client/c_api/zerod_c.h), found in the build folder next to this
package or where ``$ZEROD_LIB`` points.
"""

from zerod._native import ZerodError

__all__ = ["ZerodError"]
