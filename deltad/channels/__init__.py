"""Channels: where questions reach people besides the page and the API, and their answers come
back through the one answering path (`deltad.inbox.submit`).

    base.py     the interface a channel implements (send, withdraw, start, stop) and what it
                is given (`Context`: its state dir, the answering function, links)
    hub.py      the feed's events to every channel, on a thread beside the daemon's loop
    courier.py  a channel's own durable outbox (deltad/api/outbox.py's files and retry rule)
    email.py    questions as mail; replies, relayed by the inbox process, checked and answered
    maildir.py  the Maildir, read and parsed in the unprivileged inbox process, never as root
    grants.py   signed, expiring, single-use reply addresses
    mail.py     reading and writing mail (pure)
    config.py   the `channels:` section of the configuration
"""
