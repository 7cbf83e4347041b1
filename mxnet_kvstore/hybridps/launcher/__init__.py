"""The ``hybridrun`` launcher: the installed command, and scripts/hybridrun in a source tree.

Modules:
  binaries -- where hybridps-scheduler and hybridps-server are found.
  plan     -- hosts, the processes of a job and their environments.
  process  -- starting one process, forwarding its output, killing its group.
  job      -- running a whole job: start order, failure detection, shutdown.
  cli      -- the command line.
  kubernetes -- hybridps-k8s-entrypoint, the container entrypoint of deploy/kubernetes/.
"""
