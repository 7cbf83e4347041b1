#include "common/wire.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_format.h"
#include "common/compression.h"
#include "common/dtype.h"
#include "common/status.h"
#include "common/version.h"

namespace hybridps {

Message Encode(const std::string& peer, const wire::Envelope& env,
               std::optional<Frame> payload) {
  Message msg;
  msg.reserve(3);
  if (!peer.empty()) msg.emplace_back(peer);
  Frame body = Frame::Allocate(env.ByteSizeLong());
  env.SerializeWithCachedSizesToArray(static_cast<uint8_t*>(body.data()));
  msg.push_back(std::move(body));
  if (payload) msg.push_back(std::move(*payload));
  return msg;
}

absl::StatusOr<Decoded> Decode(Message msg, bool from_router) {
  Decoded d;
  size_t i = 0;
  if (from_router) {
    if (msg.empty()) return absl::InvalidArgumentError("empty message");
    d.peer = std::string(msg[0].view());
    i = 1;
  }
  size_t frames = msg.size() - i;
  if (frames < 1 || frames > 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected 1 or 2 frames after the routing id, got ", frames));
  }
  if (!d.env.ParseFromArray(msg[i].data(), static_cast<int>(msg[i].size()))) {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed envelope (", msg[i].size(), " bytes)"));
  }
  if (d.env.body_case() == wire::Envelope::BODY_NOT_SET) {
    return absl::InvalidArgumentError("envelope without a body");
  }
  if (frames == 2) d.payload = std::move(msg[i + 1]);
  return d;
}

wire::Envelope MakeHello(wire::NodeRole role, int rank) {
  wire::Envelope env;
  auto* h = env.mutable_hello();
  h->set_magic(kMagic);
  h->set_version(kProtocolVersion);
  h->set_software_version(Version());
  h->set_role(role);
  h->set_rank(rank);
  return env;
}

std::string VersionsDiffer(absl::string_view side_a, absl::string_view version_a,
                           absl::string_view side_b, absl::string_view version_b) {
  auto shown = [](absl::string_view v) {  // a peer's, before it proved anything: bounded
    if (v.empty()) return std::string("an unknown version (before 0.1.0)");
    return v.size() > 64 ? absl::StrCat(absl::CEscape(v.substr(0, 64)), "...")
                         : absl::CEscape(v);
  };
  return absl::StrCat("hybridps versions differ: ", side_a, " runs ", shown(version_a), ", ",
                      side_b, " runs ", shown(version_b),
                      "; every process of a job must run the same version (install the same "
                      "one on every host)");
}

absl::Status CheckHello(const wire::Hello& hello, absl::string_view receiver) {
  if (hello.magic() != kMagic) {
    return absl::FailedPreconditionError(
        absl::StrFormat("bad magic 0x%08x (expected 0x%08x): not a hybridps peer",
                        hello.magic(), kMagic));
  }
  if (hello.version() != kProtocolVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("protocol version ", hello.version(), " is not supported (this build "
                     "speaks version ", kProtocolVersion, ")"));
  }
  if (hello.software_version() != Version()) {
    return absl::FailedPreconditionError(
        VersionsDiffer(receiver, Version(), absl::StrCat("the connecting ",
                                                         WireRoleName(hello.role())),
                       hello.software_version()));
  }
  if (hello.nonce().size() != 32) {
    return absl::FailedPreconditionError(absl::StrCat(
        "a Hello with a ", hello.nonce().size(), "-byte nonce (the job-token handshake "
        "sends 32)"));
  }
  return absl::OkStatus();
}

absl::Status ValidateDataRequest(const wire::DataRequest& req,
                                 const std::optional<Frame>& payload) {
  if (req.op() != wire::OP_PUSHPULL && req.op() != wire::OP_BROADCAST) {
    return absl::InvalidArgumentError(absl::StrCat("unknown data op ", req.op()));
  }
  if (!IsValidDType(req.dtype())) {
    return absl::InvalidArgumentError(absl::StrCat("unknown dtype ", req.dtype()));
  }
  const size_t es = DTypeSize(static_cast<DType>(req.dtype()));
  if (req.count() > std::numeric_limits<uint64_t>::max() / es) {
    return absl::InvalidArgumentError(absl::StrCat("element count ", req.count(),
                                                   " overflows"));
  }
  uint64_t bytes = req.count() * es;
  if (req.compression() != 0) {
    if (req.compression() != static_cast<uint32_t>(Compression::kTwoBit)) {
      return absl::InvalidArgumentError(absl::StrCat("unknown compression ",
                                                     req.compression(), " (a newer worker?)"));
    }
    if (req.op() != wire::OP_PUSHPULL || req.dtype() != static_cast<uint32_t>(DType::kFloat32)) {
      return absl::InvalidArgumentError("2bit compression is for float32 push_pulls only");
    }
    RETURN_IF_ERROR(CheckGradientCompression({Compression::kTwoBit, req.threshold()}));
    bytes = TwoBitBytes(req.count());
  }
  if (req.shape_size() > kMaxShapeDims) {
    return absl::InvalidArgumentError(absl::StrCat("a shape of ", req.shape_size(),
                                                   " dimensions (at most ", kMaxShapeDims, ")"));
  }
  RETURN_IF_ERROR(CheckTensorShape(
      TensorShape::Of(req.shape().data(), static_cast<size_t>(req.shape_size())),
      req.total_count()));
  const bool needs_payload = req.op() == wire::OP_PUSHPULL && req.fail().empty();
  if (!req.fail().empty() && payload) {
    return absl::InvalidArgumentError("a failing request carries no payload");
  }
  if (needs_payload && !payload) {
    return absl::InvalidArgumentError("push without a payload frame");
  }
  if (payload && payload->size() != bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "payload of ", payload->size(), " bytes but the header says ", req.count(), " ",
        DTypeName(static_cast<DType>(req.dtype())), " elements (", bytes, " bytes",
        req.compression() != 0 ? ", 2bit-compressed" : "", ")"));
  }
  return absl::OkStatus();
}

wire::NodeRole ToWire(Role role) {
  switch (role) {
    case Role::kScheduler:
      return wire::ROLE_SCHEDULER;
    case Role::kServer:
      return wire::ROLE_SERVER;
    case Role::kWorker:
      return wire::ROLE_WORKER;
  }
  return wire::ROLE_UNKNOWN;
}

absl::string_view WireRoleName(wire::NodeRole role) {
  switch (role) {
    case wire::ROLE_SCHEDULER:
      return "scheduler";
    case wire::ROLE_SERVER:
      return "server";
    case wire::ROLE_WORKER:
      return "worker";
    default:
      return "unknown";
  }
}

wire::Envelope MakeError(uint64_t id, const absl::Status& status) {
  wire::Envelope env;
  env.set_id(id);
  env.mutable_error()->set_code(static_cast<int>(status.code()));
  env.mutable_error()->set_message(std::string(status.message()));
  return env;
}

absl::Status FromWire(const wire::Error& error) {
  auto code = static_cast<absl::StatusCode>(error.code());
  if (code == absl::StatusCode::kOk) code = absl::StatusCode::kUnknown;
  return absl::Status(code, error.message());
}

wire::JobSettings JobSettingsOf(const Options& options) {
  wire::JobSettings s;
  s.set_backend(options.backend);
  s.set_num_workers(options.num_workers);
  s.set_num_servers(options.num_servers);
  s.set_deployment(options.deployment);
  s.set_extra_servers(options.extra_servers);
  s.set_partition_bytes(options.partition_bytes);
  s.set_wire_chunk_bytes(options.wire_chunk_bytes);
  s.set_max_message_bytes(options.max_message_bytes);
  s.set_gpu_local_reduce(options.gpu_local_reduce);
  return s;
}

}  // namespace hybridps
