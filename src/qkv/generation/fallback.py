"""The warning a decode backend gives when another one decodes instead (its own module: the backends and the
CUDA-graph step both raise it, and ``backends`` imports ``cuda_graph``)."""


class BackendFallback(UserWarning):
    """The backend asked for cannot decode this model: another one does, and this says why."""
