"""Deploying radixray on Ray Serve (``radixray.deploy.serve.build_app``) and Kubernetes (the helm
chart in ``deploy/helm/radixray``, which runs the same Serve application as a KubeRay
RayService)."""

__all__ = ["build_app", "ServeAppConfig"]


def __getattr__(name: str):
    # Lazy: importing radixray.deploy does not import Ray Serve.
    if name == "build_app":
        from .serve import build_app

        return build_app
    if name == "ServeAppConfig":
        from .serve_config import ServeAppConfig

        return ServeAppConfig
    raise AttributeError(name)
