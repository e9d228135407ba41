"""pdsh: one parallel-shell fan-out that starts the per-node launcher on every host."""

from __future__ import annotations

import os

from ds.interfaces.runner import LaunchSpec
from ds.launcher.runners.base import RemoteAgentRunner, agent_command, remote_shell


class PdshRunner(RemoteAgentRunner):
    program = "pdsh"

    def get_cmd(self, spec: LaunchSpec) -> list[list[str]]:
        # %h is replaced by pdsh with each host name; the agent finds its node rank from it, which
        # stays right whatever order pdsh contacts the hosts in.
        agent = agent_command(
            spec, "--node_host=%h", [*self.agent_args, "--watch_output"], self.python
        )
        cmd = ["pdsh", "-S", "-f", "1024", "-R", "ssh", "-w", ",".join(spec.hosts)]
        cmd += list(spec.launcher_args)
        cmd.append(remote_shell(spec.env, agent, self.cwd))
        return [cmd]

    def env(self) -> dict[str, str]:
        """Variables the pdsh process itself needs (its ssh module reads PDSH_SSH_ARGS_APPEND)."""
        if self.ssh_port is None:
            return {}
        current = os.environ.get("PDSH_SSH_ARGS_APPEND", "")
        return {"PDSH_SSH_ARGS_APPEND": f"{current} -p {self.ssh_port}".strip()}
