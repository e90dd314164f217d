"""Short excerpts of real NCCL logs (NCCL_DEBUG=INFO), as the plugin's tests feed them to bench/nccl_log.py. Each
names where it was published and the NCCL source line that prints it (github.com/NVIDIA/nccl)."""

# ruff: noqa: E501 -- log lines are kept whole, as NCCL wrote them

from __future__ import annotations

# src/transport/nvls.cc "NVLS multicast support is %savailable on dev %d"; NVIDIA/nccl#952 (16 ranks, 2 nodes of
# 8 GPUs without NVLS; the reporter's host name was masked as <cluster_name>).
NVLS_NOT_AVAILABLE = """\
<cluster_name>:923:1147 [4] NCCL INFO Setting affinity for GPU 4 to ffff0000,00000000,00000000,00000000,ffff0000,00000000,00000000,00000000
<cluster_name>:923:1147 [4] NCCL INFO NVLS multicast support is not available on dev 4
<cluster_name>:919:1150 [0] NCCL INFO NVLS multicast support is not available on dev 0
"""

# The same line where it is available: NVIDIA/nccl#1538 (8x H100, NCCL 2.22.3).
NVLS_AVAILABLE = """\
job-3bb823c0-6d27-4312-8094-1c5910bf9b51-worker-0:5668:5722 [5] NCCL INFO NVLS multicast support is available on dev 5
job-3bb823c0-6d27-4312-8094-1c5910bf9b51-worker-0:5665:5733 [2] NCCL INFO NVLS multicast support is available on dev 2
"""

# src/enqueue.cc "%s: %ld Bytes -> Algo %s proto %s channel{Lo..Hi}={%d..%d}" (TUNING, rank 0): an all_reduce NCCL
# ran with Ring, between the per-call "AllReduce: opCount ..." lines of NCCL_DEBUG_SUBSYS=ALL (a published NCCL
# 2.27.5 log of a 16-rank sglang deployment, NCCL_ALGO=Ring NCCL_NVLS_ENABLE=0).
RING_CHOSEN = """\
tpgds-aihub0007:185302:185302 [0] NCCL INFO misc/utils.cc:233 memory stack hunk malloc(65536)
tpgds-aihub0007:185302:185302 [0] NCCL INFO AllReduce: 4 Bytes -> Algo RING proto SIMPLE channel{Lo..Hi}={0..0}
tpgds-aihub0007:185303:185303 [1] NCCL INFO AllReduce: opCount 0 sendbuff 0x7f6713e00400 recvbuff 0x7f6713e00400 count 1 datatype 7 op 0 root 0 comm 0x563d06699bf0 [nranks=16] stream 0x563d10818b20
"""

# The same line for NVLS, as measured on one 8x H100 node with NCCL 2.30.7 (published with the enqueue.cc line it
# comes from) -- the log printed without its host:pid:tid prefix.
NVLS_CHOSEN = """\
AllReduce: 4096 Bytes -> Algo RING proto LL channel{Lo..Hi}={0..0}
AllReduce: 2097152 Bytes -> Algo NVLS proto SIMPLE channel{Lo..Hi}={0..15}
"""

# src/init.cc "comm %p rank %d nRanks %d nNodes %d localRanks %d localRank %d MNNVL %d" and src/mnnvl.cc
# "MNNVL %d cliqueId %x cliqueSize %d cliqueRank %d nvlDomainSize %d": a communicator over multi-node NVLink, and
# src/transport/p2p.cc "Channel %02d/%01d : %d[%d] -> %d[%d] via P2P/%s%s%s" with "MNNVL" (GB200, 4 ranks, NCCL
# 2.30.7: run A of https://github.com/NVIDIA/nccl/issues/2303, whose every connection line was P2P/MNNVL).
MNNVL_ON = """\
watchtower-navy-cn13:2619530:2619530 [0] NCCL INFO MNNVL 1 cliqueId 2786 cliqueSize 4 cliqueRank 0 nvlDomainSize 4
watchtower-navy-cn13:2619530:2619530 [0] NCCL INFO comm 0x9a39870 rank 0 nRanks 4 nNodes 1 localRanks 4 localRank 0 MNNVL 1
watchtower-navy-cn13:2619530:2619530 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/MNNVL
"""

# The same node with NCCL_MNNVL_ENABLE=0: the same p2p.cc line says "CUMEM" (run B of NVIDIA/nccl#2303, above; the
# reporter's note in parentheses follows NCCL's line as published).
MNNVL_OFF_CUMEM = """\
watchtower-navy-cn13:2630772:2630772 [0] NCCL INFO comm 0x440e92d0 rank 0 nRanks 4 nNodes 1 localRanks 4 localRank 0 MNNVL 0
watchtower-navy-cn13:2630772:2630772 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM (all 256 connect lines are P2P/CUMEM)
"""

# src/transport/net.cc "Channel %02d/%d : %d[%d] -> %d[%d] [send] via NET/%s/%d%s%s%s" and its "[receive]" twin:
# rank 8 of a 16-rank job on two nodes of 8 GPUs, whose ranks 0-7 ran on the other node, over InfiniBand with GPUDirect
# RDMA; within the node, p2p.cc's P2P/IPC (NCCL 2.27.5; the sglang deployment RING_CHOSEN below is from:
# github.com/devopsrustem/slurmv4, 3/13.sh at e95c7d7cc07303628822f12a30d607d38da1f54d, lines 341, 355, 411, 413,
# 529, 553).
NET_IB_COMMS = """\
tpgds-aihub0008:207014:207014 [7] NCCL INFO comm 0x562f37374680 rank 15 nRanks 16 nNodes 2 localRanks 8 localRank 7 MNNVL 0
tpgds-aihub0008:207007:207007 [0] NCCL INFO comm 0x55a223a946d0 rank 8 nRanks 16 nNodes 2 localRanks 8 localRank 0 MNNVL 0
"""
NET_IB_CHANNELS = """\
tpgds-aihub0008:207007:207007 [0] NCCL INFO Channel 00/0 : 1[1] -> 8[0] [receive] via NET/IB/0/GDRDMA
tpgds-aihub0008:207007:207007 [0] NCCL INFO Channel 00/0 : 8[0] -> 15[7] via P2P/IPC
tpgds-aihub0008:207007:207007 [0] NCCL INFO Channel 07/0 : 8[0] -> 7[7] [send] via NET/IB/0/GDRDMA
tpgds-aihub0008:207007:207007 [0] NCCL INFO Connected all rings, use ring PXN 0 GDR 1
"""

# NET over TCP sockets between nodes, P2P/IPC with P2P read within one (NVIDIA/nccl#952, the log NVLS_NOT_AVAILABLE
# is from).
NET_SOCKET = """\
<cluster_name>:919:1150 [0] NCCL INFO Channel 01/0 : 8[0] -> 15[7] via P2P/IPC/read
<cluster_name>:926:1151 [7] NCCL INFO Channel 03/0 : 15[7] -> 6[6] [send] via NET/Socket/3
"""

# src/transport/shm.cc "Channel %02d : %d[%d] -> %d[%d] via SHM/%s/%s" where P2P could not be enabled, then the
# network to a rank of another node; a release before 2.18, with the PCI bus id in the brackets
# (https://github.com/NVIDIA/nccl/issues/1516).
SHM_THEN_NET = """\
ault43:1696335:1696335 [1] NCCL INFO Channel 00 : 1[81000] -> 0[41000] via SHM/direct/direct
ault43:1696335:1696402 [1] NCCL INFO Channel 00/1 : 1[81000] -> 2[41000] [send] via NET/IB/1/Shared
"""

# NET/IB between the four GPUs of one host (one process, a thread per GPU), both ends of 3 -> 2 logged; net.cc's line
# before NCCL 2.12, "Channel %02d : %d[%lx] -> %d[%lx] [receive] via NET/%s/%d%s%s"
# (https://github.com/NVIDIA/nccl/issues/707).
NET_WITHIN_A_HOST = """\
10-90-43-152:120890:121560 [0] NCCL INFO Channel 01 : 2[c7000] -> 0[87000] [receive] via NET/IB/5/GDRDMA
10-90-43-152:120890:121561 [1] NCCL INFO Channel 01 : 2[c7000] -> 1[8d000] [receive] via NET/IB/5/GDRDMA
10-90-43-152:120890:121563 [3] NCCL INFO Channel 01 : 3[ca000] -> 2[c7000] [send] via NET/IB/2/GDRDMA
10-90-43-152:120890:121562 [2] NCCL INFO Channel 01 : 3[ca000] -> 2[c7000] [receive] via NET/IB/2/GDRDMA
"""

# p2p.cc's "via P2P/direct pointer%s" (ranks in one process: https://github.com/NVIDIA/nccl/issues/1817), an
# external net plugin's name (nccl-rdma-sharp-plugins' IBext_v8: https://github.com/NVIDIA/nccl/issues/1814), and
# "P2P/IPC/read" with PCI bus ids in the brackets (https://github.com/NVIDIA/Megatron-LM/issues/516).
OTHER_TRANSPORTS = """\
sh9-machine-20250813085604-64df4c99dc-m27xf:3884994:3885084 [0] NCCL INFO Channel 01/1 : 0[0] -> 3[3] via P2P/direct pointer
hostname-test:987:1260 [7] NCCL INFO Channel 03/0 : 47[7] -> 39[7] [receive] via NET/IBext_v8/2
09677202c889:5278:5702 [3] NCCL INFO Channel 12/0 : 3[201d0] -> 2[201c0] via P2P/IPC/read
"""

# The same init line without it: NVIDIA/nccl-tests#213 (8 GPUs).
MNNVL_OFF = """\
hw14:798:811 [1] NCCL INFO comm 0x55a7be569d00 rank 1 nRanks 8 nNodes 1 localRanks 8 localRank 1 MNNVL 0
hw14:798:810 [0] NCCL INFO comm 0x55a7be5601c0 rank 0 nRanks 8 nNodes 1 localRanks 8 localRank 0 MNNVL 0
"""

# src/enqueue.cc "No algorithm/protocol available for function %s with datatype %s.%s%s": NCCL refusing a call the
# algorithms NCCL_ALGO allows cannot run (as quoted in a published tuning log, NCCL 2.2x wording).
NO_ALGORITHM = "NCCL WARN No algorithm/protocol available for AllGather with ncclInt8\n"

LOGS = {
    "NVLS_USED": NVLS_AVAILABLE + NVLS_CHOSEN.splitlines()[1] + "\n",
    "NVLS_NOT_AVAILABLE": NVLS_NOT_AVAILABLE,
    "NVLS_AVAILABLE": NVLS_AVAILABLE,
    "RING_CHOSEN": RING_CHOSEN,
    "NVLS_CHOSEN": NVLS_CHOSEN,
    "MNNVL_ON": MNNVL_ON,
    # Its init lines alone: MNNVL 1, and no connection line to say what the connections ran over.
    "MNNVL_UNTOLD": "".join(MNNVL_ON.splitlines(keepends=True)[:2]),
    "MNNVL_OFF": MNNVL_OFF,
    "NET_IB": NET_IB_COMMS + NET_IB_CHANNELS,
    "NO_ALGORITHM": NO_ALGORITHM,
}
