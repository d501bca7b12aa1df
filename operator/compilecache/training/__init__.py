"""What runs inside training processes: the verdict on the warmed cache, the runtime call, ``compilecache env``.

Nothing here runs in the operator or in warm-up Jobs (:mod:`compilecache.controller`,
:mod:`compilecache.jobtools`); the controller reads the verdict document each framework's hook
writes (:mod:`.report`) through :mod:`compilecache.controller.reports`.
"""
