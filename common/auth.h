// The job-token handshake that opens every connection to a scheduler or a server, control
// and data alike, before anything else on it is accepted:
//
//   client -> Hello{role, rank, client_nonce}
//   server -> HelloAck{server_nonce, server_proof = HMAC(K, "server" | cn | sn)}
//   client -> Auth{cn, sn, role, rank, client_proof = HMAC(K, "client" | cn | sn | role | rank)}
//
// K is derived from the job token (HMAC-SHA256, libsodium), so each side proves that it
// holds the token without sending it, and each proof covers both sides' fresh nonces, so a
// recorded handshake cannot be replayed. The server keeps no state for a connection until
// its Auth checks out: its nonce is an HMAC, under a random secret of its own process, of
// the connection's routing id and the client's nonce, recomputed when the Auth arrives
// (a replayed Auth arrives on another connection, whose routing id differs). The role and
// rank the client claims are covered by its proof and bound to its connection from then on.
#ifndef HYBRIDPS_COMMON_AUTH_H_
#define HYBRIDPS_COMMON_AUTH_H_

#include <array>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/hybridps.pb.h"
#include "common/options.h"
#include "common/transport.h"

namespace hybridps {

// The job's key, from its token. Copyable; the same in every process of a job.
class JobKey {
 public:
  explicit JobKey(absl::string_view token);
  // HMAC-SHA256 under this key of the parts, each prefixed with its length.
  std::string Mac(std::initializer_list<absl::string_view> parts) const;

 private:
  std::array<unsigned char, 32> key_;
};

// A fresh random nonce (32 bytes).
std::string NewNonce();

// The client's side: Start makes the Hello, Answer checks the server's HelloAck and makes
// the Auth that must follow it on the same connection, before any other message.
class ClientHandshake {
 public:
  ClientHandshake(const JobKey& key, wire::NodeRole role, int rank);
  wire::Envelope Hello() const;
  // The Auth for `ack`, or PermissionDenied when the server does not hold the job's key
  // (`server` names it in the error).
  absl::StatusOr<wire::Envelope> Answer(const wire::HelloAck& ack,
                                        absl::string_view server) const;

 private:
  JobKey key_;
  wire::NodeRole role_;
  int rank_;
  std::string nonce_;
};

// The server's side (a ROUTER that binds: the scheduler, a server's data port). Stateless
// per connection until Verify succeeds.
class Gatekeeper {
 public:
  explicit Gatekeeper(const JobKey& key);
  // The HelloAck for `hello` from connection `peer` (its routing id).
  wire::Envelope Challenge(absl::string_view peer, const wire::Hello& hello) const;
  // OK when `auth` on connection `peer` answers this process's challenge to that
  // connection with the job's key; else PermissionDenied saying what failed.
  absl::Status Verify(absl::string_view peer, const wire::Auth& auth) const;

 private:
  std::string ServerNonce(absl::string_view peer, absl::string_view client_nonce) const;

  JobKey key_;
  JobKey secret_;  // this process's own, random: its nonces are MACs under it
};

// HYBRIDPS_ENCRYPT=1: every link runs ZeroMQ's CURVE (Curve25519 keys, XSalsa20-Poly1305
// on every message). The bound side's key pair is derived from the job token, so only
// processes that hold it can even complete the transport's handshake; each connecting
// socket makes a fresh key pair. Both are no-ops with encryption off and on inproc://
// endpoints (no bytes leave the process). Call before Bind / Connect.
absl::Status EncryptAsServer(Socket& socket, const Options& options,
                             absl::string_view endpoint);
absl::Status EncryptAsClient(Socket& socket, const Options& options,
                             absl::string_view endpoint);

}  // namespace hybridps

#endif  // HYBRIDPS_COMMON_AUTH_H_
