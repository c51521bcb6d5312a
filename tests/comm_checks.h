// Checks written once against the Communicator interface and run on every backend: the
// threads suite calls them inside run_threads, the MPI suite on MPI_COMM_WORLD under mpirun.
// A failed check throws (so a thread rank fails and releases the others, and an MPI rank
// aborts the job instead of hanging it).
#pragma once

#include <cstdint>

#include "dcp/comm.h"

namespace dcp::test {

// Every collective against exact integer-valued expectations, payloads 0 B .. `max_bytes`.
void check_collectives(Communicator& comm, std::size_t max_bytes);
// split(): colour/key ordering and traffic inside the new groups.
void check_split(Communicator& comm);
// broadcast_patiently and broadcast_bytes(patiently) from every root, which comes late (past the
// others' spin, into their sleeping polls) or at once: every rank gets the root's bytes, and the
// collectives after them still pair up.
void check_patient_broadcast(Communicator& comm);
// probe, send_bytes and recv_bytes (patient or not): nothing waits before a message is sent, a
// message sent is seen by probe before it is received and not after, bytes arrive whole.
void check_probe_and_messages(Communicator& comm);
// Measured bytes per collective equal the documented formulas.
void check_byte_accounting(Communicator& comm);
// The DCP attention step equals float64 full attention for every mask variant, both combine
// backends, both query modes, decode and multi-token queries; bytes match the formulas.
// `seed` must be equal on every rank.
void check_dcp_step(Communicator& comm, std::uint64_t seed);

}  // namespace dcp::test
