"""KubernetesJob: an indexed Job plus a headless Service, one agent pod per host.

Renders manifests only: `manifests()` / `to_yaml()` give what `kubectl apply -f -` takes,
and `state()` attaches to the pods' stable DNS names. The cluster key comes from a Secret
mounted read-only into each pod. Not exercised against a live cluster (none can run here);
the tests validate the manifests against the Kubernetes API schemas.
"""
from __future__ import annotations

import base64
import re
import subprocess
from pathlib import Path
from typing import Any

from .base import Job, JobError, slots

__all__ = ["KEY_MOUNT", "KEY_COPY", "KubernetesJob"]

_DNS_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
KEY_MOUNT = "/etc/monarch"
# sh -c KEY_COPY sh KEY PYTHON ARGS...: run the agent with a private copy of the key
KEY_COPY = ('set -eu; umask 077; d=$(mktemp -d); cat "$1" > "$d/cluster.key"; '
            'py=$2; shift 2; exec "$py" -m runtime.host "$@" --key-file "$d/cluster.key"')


def _dns_label(kind: str, value: str, limit: int = 63) -> str:
    if not isinstance(value, str) or len(value) > limit or not _DNS_RE.match(value):
        raise ValueError(f"{kind} {value!r} must be a DNS label (lowercase letters, digits, '-', "
                         f"at most {limit} characters)")
    return value


class KubernetesJob(Job):
    """One indexed Job per mesh (pods `<job>-<i>`), behind one headless Service for DNS."""

    kind = "kubernetes"

    def __init__(self, meshes: dict[str, int], *, image: str, name: str = "monarch",
                 namespace: str = "default", port: int = 26600, python: str = "python",
                 cpu: str | None = None, memory: str | None = None, gpus: int = 0,
                 service_account: str | None = None, **kw) -> None:
        super().__init__(meshes, **kw)
        if not isinstance(image, str) or not image or any(c.isspace() for c in image):
            raise ValueError(f"image must be a container image reference, got {image!r}")
        self.image = image
        self.name = _dns_label("name", name, 40)
        self.namespace = _dns_label("namespace", namespace)
        for mesh in self.meshes:
            _dns_label("mesh name (as part of a pod name)", self._job_name(mesh), 52)
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            raise ValueError(f"port must be a TCP port number, got {port!r}")
        self.port = port
        self.python = python
        self.cpu, self.memory, self.gpus = cpu, memory, int(gpus)
        self.service_account = service_account

    @property
    def service(self) -> str:
        return f"{self.name}-agents"

    @property
    def secret(self) -> str:
        return f"{self.name}-key"

    def _job_name(self, mesh: str) -> str:
        return f"{self.name}-{mesh.lower().replace('_', '-')}"

    def addresses(self) -> dict[tuple[str, int], str]:
        """Each agent's stable address: `tcp://<job>-<i>.<service>.<ns>.svc:<port>`."""
        return {(m, i): f"tcp://{self._job_name(m)}-{i}.{self.service}.{self.namespace}.svc:{self.port}"
                for m, i in slots(self.meshes)}

    # --- rendering (pure) ---------------------------------------------------------------
    def _labels(self, mesh: str | None = None) -> dict[str, str]:
        labels = {"app.kubernetes.io/name": "monarch-agent",
                  "app.kubernetes.io/instance": self.name}
        if mesh is not None:
            labels["monarch.dev/mesh"] = mesh.lower().replace("_", "-")
        return labels

    def _job(self, mesh: str, n: int) -> dict[str, Any]:
        resources: dict[str, dict[str, Any]] = {}
        for key, val in (("cpu", self.cpu), ("memory", self.memory)):
            if val is not None:
                resources.setdefault("requests", {})[key] = val
                resources.setdefault("limits", {})[key] = val
        if self.gpus:
            resources.setdefault("limits", {})["nvidia.com/gpu"] = self.gpus
        container: dict[str, Any] = {
            "name": "agent",
            "image": self.image,
            # a mounted Secret is a link in a directory others can read: the agent refuses
            # such a key file, so it gets a private copy (0600 in a 0700 directory)
            "command": ["sh", "-c", KEY_COPY, "sh", f"{KEY_MOUNT}/cluster.key", self.python,
                        "--listen", f"tcp://$(POD_IP):{self.port}"],
            "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
            "ports": [{"name": "agent", "containerPort": self.port, "protocol": "TCP"}],
            "volumeMounts": [{"name": "key", "mountPath": KEY_MOUNT, "readOnly": True}],
            "readinessProbe": {"tcpSocket": {"port": self.port}, "periodSeconds": 2},
        }
        if resources:
            container["resources"] = resources
        pod_spec: dict[str, Any] = {
            "subdomain": self.service,  # with an indexed Job: hostname <job>-<index>
            "restartPolicy": "Never",
            "containers": [container],
            "volumes": [{"name": "key", "secret": {"secretName": self.secret,
                                                   "defaultMode": 0o400}}],
        }
        if self.service_account:
            pod_spec["serviceAccountName"] = self.service_account
        return {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": self._job_name(mesh), "namespace": self.namespace,
                         "labels": self._labels(mesh)},
            "spec": {
                "completionMode": "Indexed",
                "completions": n,
                "parallelism": n,
                "backoffLimitPerIndex": 0,  # a lost pod is reported, not silently replaced
                "maxFailedIndexes": n,      # others keep running when one index fails
                "template": {"metadata": {"labels": self._labels(mesh)}, "spec": pod_spec},
            },
        }

    def manifests(self, key: bytes | None = None) -> list[dict[str, Any]]:
        """Service, Secret (when `key` is given) and one indexed Job per mesh, as dicts."""
        out: list[dict[str, Any]] = [{
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": self.service, "namespace": self.namespace,
                         "labels": self._labels()},
            "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                     "selector": self._labels(),
                     "ports": [{"name": "agent", "port": self.port, "targetPort": self.port,
                                "protocol": "TCP"}]},
        }]
        if key is not None:
            out.append({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                        "metadata": {"name": self.secret, "namespace": self.namespace,
                                     "labels": self._labels()},
                        "data": {"cluster.key": base64.b64encode(key).decode()}})
        out += [self._job(m, n) for m, n in self.meshes.items()]
        return out

    def to_yaml(self, key: bytes | None = None) -> str:
        """The manifests as one multi-document YAML string."""
        import yaml

        return yaml.safe_dump_all(self.manifests(key), sort_keys=False)

    # --- Job hooks (need kubectl and a cluster: not exercised here) ---------------------
    def _kubectl(self, *args: str, input: str | None = None) -> str:
        r = subprocess.run(["kubectl", *args], input=input, capture_output=True, text=True,
                           timeout=120)
        if r.returncode != 0:
            raise JobError(f"kubectl {' '.join(args)} failed: {r.stderr.strip()}")
        return r.stdout

    def _launch(self) -> None:
        assert self.key_file is not None
        self._kubectl("apply", "-f", "-", input=self.to_yaml(Path(self.key_file).read_bytes()))

    def _addresses(self) -> dict[tuple[str, int], str]:
        ready = self._kubectl("get", "pods", "-n", self.namespace, "-l",
                              f"app.kubernetes.io/instance={self.name}", "-o",
                              "jsonpath={range .items[*]}{.metadata.labels.monarch\\.dev/mesh} "
                              "{.metadata.annotations.batch\\.kubernetes\\.io/job-completion-index} "
                              "{.status.containerStatuses[0].ready}{\"\\n\"}{end}")
        up = {tuple(line.split()[:2]) for line in ready.splitlines() if line.endswith("true")}
        return {(m, i): a for (m, i), a in self.addresses().items()
                if (m.lower().replace("_", "-"), str(i)) in up}

    def _check(self) -> str:
        return "pods starting"

    def _cancel(self) -> None:
        try:
            self._kubectl("delete", "-n", self.namespace, "--ignore-not-found", "--wait=false",
                          "job,service,secret", "-l", f"app.kubernetes.io/instance={self.name}")
        except (JobError, FileNotFoundError, subprocess.TimeoutExpired):
            pass
