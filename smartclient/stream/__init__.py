"""The stream wing, over rstream: ``StreamEnvironment`` (the facade the :class:`smartclient.Environment` face is
built on), the placement shell, handles, publishing and super streams.  The ``_rstream`` package is the one
place that imports rstream and touches its internals."""
