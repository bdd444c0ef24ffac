"""The launcher: the ``candlewire`` command and the local stack, above every service.

The services (``relay``, ``ingest``, ``streaming``, ``gateway``, ``orchestration``) import
only the shared lower layer, :mod:`candlewire`; this package is the one place that knows
them all, to run them as processes (:mod:`launcher.cli`) and to start, stop and check the
whole local platform (:mod:`launcher.stack`, with private servers from :mod:`launcher.local`
and Dagster's local instance from :mod:`launcher.dagster_home`).
"""
