"""Monarch's configure() names that have no equivalent here, each with why: `configure()`
warns about them and ignores them; docs/configuration.md lists them.

Layer 1 (basics): plain data.
"""

from __future__ import annotations

__all__ = ["UNMAPPED"]

UNMAPPED: dict[str, str] = {
    "default_transport": "transports are chosen by topology (ipc locally, CurveZMQ tcp "
                         "across hosts)",
    "enable_log_forwarding": "proc output is always forwarded to the controller",
    "message_delivery_timeout": "a message fails when its proc or host fails "
                                "(heartbeat_timeout), not after a delivery timeout",
    "host_spawn_ready_timeout": "spawn waits are bounded by the caller's .get(timeout)",
    "mesh_proc_spawn_max_idle": "spawn waits are bounded by the caller's .get(timeout)",
    "process_exit_timeout": "procs are killed after stop_timeout",
    "cleanup_timeout": "one deadline (stop_timeout) covers `__cleanup__` and stopping",
    "supervision_watchdog_timeout": "procs leave when their controller/agent dies "
                                    "(PDEATHSIG), peers use heartbeat_timeout",
    "remote_allocator_heartbeat_interval": "no remote allocator; see heartbeat_interval",
    "default_encoding": "messages are always msgpack header + cloudpickle body",
    "mesh_bootstrap_enable_pdeathsig": "procs and agents always die with their parent",
    "actor_queue_dispatch": "each actor serves its messages from one queue in order "
                            "(`@concurrent_endpoint` interleaves async endpoints)",
    "mesh_attach_config_timeout": "attach_to_workers() pushes no settings to the agents; "
                                  "each spawn carries the controller's settings",
    "mesh_orphan_timeout": "procs end when their controller dies (PDEATHSIG on its host; "
                           "agents on other hosts end them after 2 x heartbeat_timeout of "
                           "silence once zmq's heartbeats on the link to it go unanswered, "
                           "or gateway_lease through a gateway)",
    "mesh_terminate_concurrency": "stop() ends all procs of a mesh at once",
    "mesh_terminate_timeout": "procs are killed after stop_timeout",
    "actor_spawn_max_idle": "spawn waits are bounded by the caller's .get(timeout)",
    "get_actor_state_max_idle": "waits are bounded by the caller's .get(timeout)",
    "proc_stop_max_idle": "procs are killed after stop_timeout",
    "get_proc_state_max_idle": "waits are bounded by the caller's .get(timeout)",
    "mesh_admin_addr": "the admin endpoint listens on loopback only (see `admin`)",
    "message_ack_time_interval": "messages travel on reliable, ordered ZeroMQ connections; "
                                 "there are no acks to tune",
    "message_ack_every_n_messages": "messages travel on reliable, ordered ZeroMQ "
                                    "connections; there are no acks to tune",
    "message_ttl_default": "messages go straight to their proc (or its host agent), not "
                           "through forwarders, so they carry no TTL",
    "message_latency_sampling_rate": "message latency is not sampled",
    "enable_dest_actor_reordering_buffer": "messages from one sender reach an actor in order "
                                           "(one connection per pair)",
    "split_max_buffer_size": "messages are not split; large arrays travel as zero-copy "
                             "frames, above max_message_bytes on the data plane",
    "split_max_buffer_age": "messages are not split; large arrays travel as zero-copy "
                            "frames, above max_message_bytes on the data plane",
    "small_write_threshold": "serialization picks zero-copy frames for arrays and tensors "
                             "itself",
    "channel_net_rx_buffer_full_check_interval": "ZeroMQ does its own flow control",
    "max_cast_dimension_size": "a cast goes to each host agent once, which fans it out",
    "remote_alloc_bind_to_inaddr_any": "no remote allocator; agents bind the address given "
                                       "to `python -m runtime.host --listen`",
    "remote_alloc_bootstrap_addr": "no remote allocator; agents bind the address given to "
                                   "`python -m runtime.host --listen`",
    "remote_alloc_allowed_port_range": "no remote allocator; agents bind the address given "
                                       "to `python -m runtime.host --listen`",
    "read_log_buffer": "host agents forward proc output line by line",
    "force_file_log": "this_host()'s agent writes proc log files with file_capture=True "
                      "(jobs' agents write them by default)",
    "prefix_with_rank": "forwarded output is always prefixed with its mesh and rank",
    "rdma_allow_tcp_fallback": "rdma_transport=auto falls back to process_vm or TCP "
                               "without an ibverbs device; rdma_transport forces one",
    "rdma_disable_ibverbs": "use rdma_transport ('tcp' or 'vm') to keep transfers off "
                            "ibverbs",
    "rdma_max_chunk_size_mb": "TCP transfers are split over rdma_streams streams, not "
                              "into chunk messages",
    "rdma_ibverbs_target": "choose the ibverbs device with rdma_ib_device",
    "rdma_peer_device_affinity": "one ibverbs device per process (rdma_ib_device)",
    "rdma_runtime_worker_threads": "see rdma_streams and rdma_vm_threads",
}
