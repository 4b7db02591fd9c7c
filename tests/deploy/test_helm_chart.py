"""The helm chart, offline: lint and render with helm's own Go SDK (``helm-python-sdk``; no helm
binary here), validate core objects with ``kubernetes-validate``, the RayService against a
schema of the fields we use, and the Serve config inside it against Ray Serve's own schema and
radixray's ``ServeAppConfig``."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

helm = pytest.importorskip("helm_python")
kubernetes_validate = pytest.importorskip("kubernetes_validate")

from ray.serve.schema import ServeDeploySchema  # noqa: E402

from radixray.deploy.serve_config import ServeAppConfig  # noqa: E402
from radixray.router.policies import policy_names  # noqa: E402
from radixray.worker.engine_config import EngineConfig  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy/helm/radixray"
KUBE_VERSION = "1.30.0"
RAYSERVICE_SCHEMA = json.loads((Path(__file__).parent / "rayservice.schema.json").read_text())


def render(values: dict | None = None) -> dict[str, dict]:
    """Rendered objects by kind (one object per kind in this chart)."""
    out = helm.Chart.load(CHART).render(values or {}, name="rr", namespace="llm", is_install=True)
    objs: dict[str, dict] = {}
    for path, text in out.items():
        if not path.endswith((".yaml", ".yml")):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                assert doc["kind"] not in objs, f"two {doc['kind']} objects"
                objs[doc["kind"]] = doc
    return objs


def check_objects(objs: dict[str, dict]) -> dict:
    """Validate every object; return the Serve app's args."""
    for kind in ("Service", "Secret"):
        if kind in objs:
            kubernetes_validate.validate(objs[kind], KUBE_VERSION, strict=True)
    rs = objs["RayService"]
    jsonschema.validate(rs, RAYSERVICE_SCHEMA)
    cluster = rs["spec"]["rayClusterConfig"]
    templates = [cluster["headGroupSpec"]["template"]] + [
        g["template"] for g in cluster["workerGroupSpecs"]
    ]
    for t in templates:
        pod_template = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}}
        kubernetes_validate.validate(pod_template | {"template": t}, KUBE_VERSION, strict=True)
    serve_cfg = yaml.safe_load(rs["spec"]["serveConfigV2"])
    ServeDeploySchema.model_validate(serve_cfg)  # what KubeRay hands to Serve
    (app,) = serve_cfg["applications"]
    assert app["import_path"] == "radixray.deploy.serve:build_app"
    ServeAppConfig.from_dict(app["args"])  # what build_app will accept
    return app["args"]


def containers(rs: dict) -> tuple[dict, dict]:
    cluster = rs["spec"]["rayClusterConfig"]
    head = cluster["headGroupSpec"]["template"]["spec"]["containers"][0]
    (group,) = cluster["workerGroupSpecs"]
    return head, group["template"]["spec"]["containers"][0]


def test_chart_lints_clean():
    report = helm.lint(CHART, strict=True, kube_version=f"v{KUBE_VERSION}")
    assert report["errors"] == []
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert problems == [], problems


def test_default_render_is_valid_and_gpu_shaped():
    objs = render()
    assert set(objs) == {"RayService", "Service"}  # no Secret, no ServiceMonitor by default
    args = check_objects(objs)
    assert (args["model"], args["policy"], args["page_size"]) == ("smollm2", "ttft", 16)
    assert args["workers"]["num_gpus"] == 1 and args["workers"]["num_replicas"] == 2
    # No engine field in the chart: every worker runs EngineConfig's defaults (device "auto").
    assert args["engine"] == {}
    engine = EngineConfig(**ServeAppConfig.from_dict(args).engine_config("w0"))
    assert engine.device == "auto" and engine == EngineConfig(model="smollm2", worker_id="w0")

    rs = objs["RayService"]
    (group,) = rs["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == 2
    head, worker = containers(rs)
    for kind in ("requests", "limits"):
        assert worker["resources"][kind]["nvidia.com/gpu"] == 1
    assert "nvidia.com/gpu" not in head["resources"]["limits"]
    probe = head["readinessProbe"]["httpGet"]
    assert probe["path"] == "/health" and probe["port"] == "serve"
    assert {"containerPort": 8000, "name": "serve", "protocol": "TCP"} in head["ports"]
    assert "env" not in head  # admin API off: no token anywhere

    svc = objs["Service"]
    assert svc["spec"]["selector"]["ray.io/serve"] == "true"
    assert svc["spec"]["ports"][0]["targetPort"] == 8000


def test_non_default_values_land():
    objs = render(
        {
            "model": {
                "name": "/models/llama-3-8b-instruct",
                "servedName": "llama-3-8b",
                "volume": {"persistentVolumeClaim": {"claimName": "llama-weights"}},
            },
            "router": {
                "policy": "cache_aware",
                "pageSize": 32,
                "replicas": 2,
                "port": 8100,
                "autoscaling": {"enabled": True, "minReplicas": 2, "maxReplicas": 5},
            },
            "workers": {
                "replicas": 3,
                "autoscaling": {"enabled": True, "minReplicas": 2, "maxReplicas": 6},
                "resources": {"requests": {"cpu": "10", "memory": "40Gi"}},
            },
            "engine": {"kv_memory_bytes": 30_000_000_000},
            "hostPages": 4096,
            "adminToken": {"existingSecret": "radixray-admin", "secretKey": "bearer"},
            "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
            "image": {"tag": "0.1.0-cu124"},
        }
    )
    assert set(objs) == {"RayService", "Service", "ServiceMonitor"}
    args = check_objects(objs)
    assert args["model"] == "/models/llama-3-8b-instruct"
    assert args["served_model_name"] == "llama-3-8b"
    assert (args["policy"], args["page_size"]) == ("cache_aware", 32)
    assert args["engine"] == {"kv_memory_bytes": 30_000_000_000, "host_pages": 4096}
    router_auto = args["router"]["autoscaling_config"]
    assert (router_auto["min_replicas"], router_auto["max_replicas"]) == (2, 5)
    assert router_auto["initial_replicas"] == 2 and "num_replicas" not in args["router"]
    auto = args["workers"]["autoscaling_config"]
    assert (auto["min_replicas"], auto["max_replicas"], auto["initial_replicas"]) == (2, 6, 3)
    assert "num_replicas" not in args["workers"]

    rs = objs["RayService"]
    cluster = rs["spec"]["rayClusterConfig"]
    assert cluster["enableInTreeAutoscaling"] is True
    (group,) = cluster["workerGroupSpecs"]
    assert (group["replicas"], group["minReplicas"], group["maxReplicas"]) == (3, 2, 6)
    assert yaml.safe_load(rs["spec"]["serveConfigV2"])["http_options"]["port"] == 8100
    head, worker = containers(rs)
    assert worker["resources"]["requests"] == {"cpu": "10", "memory": "40Gi", "nvidia.com/gpu": 1}
    assert worker["image"] == "ghcr.io/radixray/radixray:0.1.0-cu124"
    for c in (head, worker):
        (env,) = c["env"]
        assert env["name"] == "RADIXRAY_ADMIN_TOKEN"
        assert env["valueFrom"]["secretKeyRef"] == {"name": "radixray-admin", "key": "bearer"}
        assert c["volumeMounts"] == [{"name": "model", "mountPath": "/models", "readOnly": True}]
    pod = group["template"]["spec"]
    assert pod["volumes"][0]["persistentVolumeClaim"]["claimName"] == "llama-weights"

    sm = objs["ServiceMonitor"]
    assert sm["metadata"]["labels"]["release"] == "prometheus"
    assert sm["spec"]["endpoints"][0]["path"] == "/metrics"
    svc_labels = objs["Service"]["metadata"]["labels"]
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc_labels.items()
    assert sm["spec"]["endpoints"][0]["port"] == objs["Service"]["spec"]["ports"][0]["name"]


def test_chart_can_create_the_admin_secret():
    objs = render({"adminToken": {"create": True, "value": "s3cret"}})
    check_objects(objs)
    secret = objs["Secret"]
    assert secret["stringData"] == {"token": "s3cret"}
    head, _ = containers(objs["RayService"])
    assert head["env"][0]["valueFrom"]["secretKeyRef"]["name"] == secret["metadata"]["name"]
    with pytest.raises(helm.HelmError, match="adminToken.value is empty"):
        render({"adminToken": {"create": True}})


@pytest.mark.parametrize(
    ("values", "where"),
    [
        ({"router": {"policy": "fastest"}}, "/router/policy"),
        ({"router": {"pageSize": 12}}, "/router/pageSize"),
        ({"workers": {"replicas": 0}}, "/workers/replicas"),
        ({"engine": {"page_size": 8}}, "propertyName 'page_size'"),
        ({"router": {"settings": {"admin_token": "x"}}}, "propertyName 'admin_token'"),
        ({"workers": {"resources": {"limits": {"nvidia.com/gpu": 2}}}}, "'nvidia.com/gpu'"),
        ({"modle": {"name": "x"}}, "modle"),
        ({"hostPages": -1}, "/hostPages"),
    ],
)
def test_values_schema_rejects_bad_values(values, where):
    with pytest.raises(helm.HelmValuesError, match=where):
        render(values)


def test_values_schema_lists_exactly_the_registered_policies():
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert sorted(schema["properties"]["router"]["properties"]["policy"]["enum"]) == sorted(
        policy_names()
    )
