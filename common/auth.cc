#include "common/auth.h"

#include <sodium.h>
#include <zmq.h>

#include <cstdlib>

#include "absl/base/call_once.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/version.h"
#include "common/wire.h"

namespace hybridps {
namespace {

void InitSodium() {
  static absl::once_flag once;
  absl::call_once(once, [] {
    if (sodium_init() < 0) std::abort();  // no usable random source: nothing is safe
  });
}

std::string Le32(uint32_t v) {
  std::string s(4, '\0');
  for (int i = 0; i < 4; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

bool SameMac(absl::string_view a, absl::string_view b) {
  return a.size() == crypto_auth_hmacsha256_BYTES && b.size() == a.size() &&
         crypto_verify_32(reinterpret_cast<const unsigned char*>(a.data()),
                          reinterpret_cast<const unsigned char*>(b.data())) == 0;
}

std::string RoleRank(wire::NodeRole role, int rank) {
  return absl::StrCat(Le32(static_cast<uint32_t>(role)), Le32(static_cast<uint32_t>(rank)));
}

}  // namespace

JobKey::JobKey(absl::string_view token) {
  InitSodium();
  // K = HMAC-SHA256(SHA-256(token), label): a fixed-size key whatever the token's length.
  unsigned char hashed[crypto_hash_sha256_BYTES];
  crypto_hash_sha256(hashed, reinterpret_cast<const unsigned char*>(token.data()),
                     token.size());
  static constexpr absl::string_view kLabel = "hybridps job key 1";
  crypto_auth_hmacsha256(key_.data(), reinterpret_cast<const unsigned char*>(kLabel.data()),
                         kLabel.size(), hashed);
  sodium_memzero(hashed, sizeof hashed);
}

std::string JobKey::Mac(std::initializer_list<absl::string_view> parts) const {
  crypto_auth_hmacsha256_state st;
  crypto_auth_hmacsha256_init(&st, key_.data(), key_.size());
  for (absl::string_view p : parts) {
    const std::string len = Le32(static_cast<uint32_t>(p.size()));
    crypto_auth_hmacsha256_update(&st, reinterpret_cast<const unsigned char*>(len.data()),
                                  len.size());
    crypto_auth_hmacsha256_update(&st, reinterpret_cast<const unsigned char*>(p.data()),
                                  p.size());
  }
  std::string out(crypto_auth_hmacsha256_BYTES, '\0');
  crypto_auth_hmacsha256_final(&st, reinterpret_cast<unsigned char*>(out.data()));
  return out;
}

std::string NewNonce() {
  InitSodium();
  std::string n(32, '\0');
  randombytes_buf(n.data(), n.size());
  return n;
}

ClientHandshake::ClientHandshake(const JobKey& key, wire::NodeRole role, int rank)
    : key_(key), role_(role), rank_(rank), nonce_(NewNonce()) {}

wire::Envelope ClientHandshake::Hello() const {
  wire::Envelope env = MakeHello(role_, rank_);
  env.mutable_hello()->set_nonce(nonce_);
  return env;
}

absl::StatusOr<wire::Envelope> ClientHandshake::Answer(const wire::HelloAck& ack,
                                                       absl::string_view server) const {
  if (ack.software_version() != Version()) {
    return absl::FailedPreconditionError(
        VersionsDiffer(absl::StrCat("this ", WireRoleName(role_)), Version(), server,
                       ack.software_version()));
  }
  if (!SameMac(ack.proof(), key_.Mac({"server", nonce_, ack.nonce()}))) {
    return absl::PermissionDeniedError(absl::StrCat(
        server, " does not hold this job's token: HYBRIDPS_JOB_TOKEN (or the file named by "
        "HYBRIDPS_JOB_TOKEN_FILE) differs between this process and it (another job's, or "
        "not this job's at all)"));
  }
  wire::Envelope env;
  auto* a = env.mutable_auth();
  a->set_client_nonce(nonce_);
  a->set_server_nonce(ack.nonce());
  a->set_role(role_);
  a->set_rank(rank_);
  a->set_proof(key_.Mac({"client", nonce_, ack.nonce(), RoleRank(role_, rank_)}));
  return env;
}

Gatekeeper::Gatekeeper(const JobKey& key) : key_(key), secret_(NewNonce()) {}

std::string Gatekeeper::ServerNonce(absl::string_view peer,
                                    absl::string_view client_nonce) const {
  return secret_.Mac({"nonce", peer, client_nonce});
}

wire::Envelope Gatekeeper::Challenge(absl::string_view peer, const wire::Hello& hello) const {
  const std::string nonce = ServerNonce(peer, hello.nonce());
  wire::Envelope env;
  auto* ack = env.mutable_hello_ack();
  ack->set_nonce(nonce);
  ack->set_proof(key_.Mac({"server", hello.nonce(), nonce}));
  ack->set_software_version(Version());
  return env;
}

absl::Status Gatekeeper::Verify(absl::string_view peer, const wire::Auth& auth) const {
  if (auth.client_nonce().size() != 32 ||
      !SameMac(auth.server_nonce(), ServerNonce(peer, auth.client_nonce()))) {
    return absl::PermissionDeniedError(
        "an Auth that answers no challenge of this process on this connection (replayed?)");
  }
  if (!SameMac(auth.proof(), key_.Mac({"client", auth.client_nonce(), auth.server_nonce(),
                                       RoleRank(auth.role(), auth.rank())}))) {
    return absl::PermissionDeniedError("an Auth without the job's token");
  }
  return absl::OkStatus();
}

namespace {

bool Encrypted(const Options& options, absl::string_view endpoint) {
  return options.encrypt != 0 && !absl::StartsWith(endpoint, "inproc://");
}

absl::Status SetKey(Socket& socket, int option, const unsigned char* key, const char* what) {
  if (zmq_setsockopt(socket.raw(), option, key, 32) != 0) {
    return absl::InternalError(absl::StrCat("zmq_setsockopt(", what, "): ",
                                            zmq_strerror(zmq_errno())));
  }
  return absl::OkStatus();
}

absl::Status CheckCurve() {
  if (!zmq_has("curve")) {
    return absl::FailedPreconditionError(
        "HYBRIDPS_ENCRYPT=1, but this ZeroMQ library was built without CURVE (libsodium)");
  }
  return absl::OkStatus();
}

// The bound side's key pair, the same in every process that holds the token.
void ServerKeys(const Options& options, unsigned char pk[32], unsigned char sk[32]) {
  const std::string seed = JobKey(options.job_token).Mac({"curve server key"});
  crypto_box_seed_keypair(pk, sk, reinterpret_cast<const unsigned char*>(seed.data()));
}

}  // namespace

absl::Status EncryptAsServer(Socket& socket, const Options& options,
                             absl::string_view endpoint) {
  if (!Encrypted(options, endpoint)) return absl::OkStatus();
  RETURN_IF_ERROR(CheckCurve());
  unsigned char pk[32], sk[32];
  ServerKeys(options, pk, sk);
  const int one = 1;
  if (zmq_setsockopt(socket.raw(), ZMQ_CURVE_SERVER, &one, sizeof one) != 0) {
    return absl::InternalError(absl::StrCat("zmq_setsockopt(ZMQ_CURVE_SERVER): ",
                                            zmq_strerror(zmq_errno())));
  }
  absl::Status s = SetKey(socket, ZMQ_CURVE_SECRETKEY, sk, "ZMQ_CURVE_SECRETKEY");
  sodium_memzero(sk, sizeof sk);
  return s;
}

absl::Status EncryptAsClient(Socket& socket, const Options& options,
                             absl::string_view endpoint) {
  if (!Encrypted(options, endpoint)) return absl::OkStatus();
  RETURN_IF_ERROR(CheckCurve());
  unsigned char server_pk[32], server_sk[32], pk[32], sk[32];
  ServerKeys(options, server_pk, server_sk);
  sodium_memzero(server_sk, sizeof server_sk);
  crypto_box_keypair(pk, sk);
  RETURN_IF_ERROR(SetKey(socket, ZMQ_CURVE_SERVERKEY, server_pk, "ZMQ_CURVE_SERVERKEY"));
  RETURN_IF_ERROR(SetKey(socket, ZMQ_CURVE_PUBLICKEY, pk, "ZMQ_CURVE_PUBLICKEY"));
  absl::Status s = SetKey(socket, ZMQ_CURVE_SECRETKEY, sk, "ZMQ_CURVE_SECRETKEY");
  sodium_memzero(sk, sizeof sk);
  return s;
}

}  // namespace hybridps
