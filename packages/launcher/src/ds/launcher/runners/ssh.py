"""ssh: one ssh client per node, each starting the per-node launcher on its host.

The agent is told to watch its stdin: when the launcher (and so the ssh client) goes away, the
remote stdin closes and the agent stops its ranks, so a lost connection leaves no remote orphans.
"""

from __future__ import annotations

from ds.interfaces.runner import LaunchSpec
from ds.launcher.runners.base import RemoteAgentRunner, agent_command, remote_shell


class SshRunner(RemoteAgentRunner):
    program = "ssh"

    def get_cmd(self, spec: LaunchSpec) -> list[list[str]]:
        out = []
        for node_rank, host in enumerate(spec.hosts):
            agent = agent_command(
                spec,
                f"--node_rank={node_rank}",
                [*self.agent_args, "--watch_stdin", "--watch_output"],
                self.python,
            )
            cmd = ["ssh", "-o", "BatchMode=yes"]
            if self.ssh_port is not None:
                cmd += ["-p", str(self.ssh_port)]
            cmd += list(spec.launcher_args)
            cmd += [host, remote_shell(spec.env, agent, self.cwd)]
            out.append(cmd)
        return out
