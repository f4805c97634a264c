"""The inbox process's entry (`python -m deltad.http --core-fd N`, as the core starts it):
no_new_privs before any other module is even imported."""

import ctypes
import sys

PR_SET_NO_NEW_PRIVS = 38

if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
    sys.exit("deltad inbox: cannot set no_new_privs")

from deltad.http.child import main  # noqa: E402 - after no_new_privs, on purpose

sys.exit(main())
