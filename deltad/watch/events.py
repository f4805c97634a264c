"""The event vocabulary of every watch backend: inotify's bit values, defined here so that
no module but `inotify.py` needs the Linux-only `inotify_simple` (watchdog off Linux reports
its events in these terms too). Values from <sys/inotify.h>."""

MODIFY = 0x00000002
CLOSE_WRITE = 0x00000008
MOVED_FROM = 0x00000040
MOVED_TO = 0x00000080
CREATE = 0x00000100
DELETE = 0x00000200
DELETE_SELF = 0x00000400
MOVE_SELF = 0x00000800
Q_OVERFLOW = 0x00004000
IGNORED = 0x00008000
ONLYDIR = 0x01000000
DONT_FOLLOW = 0x02000000
EXCL_UNLINK = 0x04000000
MASK_ADD = 0x20000000
ISDIR = 0x40000000
