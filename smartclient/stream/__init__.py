"""The stream wing, over rstream: ``StreamWing`` (``env.streams`` of the :class:`smartclient.Environment` face), the
placement shell, handles, publishing and super streams.  The ``_rstream`` package is the one
place that imports rstream and touches its internals."""
