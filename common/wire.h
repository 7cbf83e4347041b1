// Encoding and validation of wire messages: [routing id (ROUTER side only)] [Envelope]
// [payload (optional)]. Remote input is never trusted: every decode checks the frame
// count, the protobuf, and that a payload's size matches its declared dtype and count.
#ifndef HYBRIDPS_COMMON_WIRE_H_
#define HYBRIDPS_COMMON_WIRE_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "common/hybridps.pb.h"
#include "common/options.h"
#include "common/transport.h"

namespace hybridps {

inline constexpr uint32_t kMagic = 0x48505321;  // "HPS!"
inline constexpr uint32_t kProtocolVersion = 2;  // 2: the job-token handshake (common/auth.h)

struct Decoded {
  std::string peer;              // routing id (ROUTER side), else empty
  wire::Envelope env;
  std::optional<Frame> payload;  // the raw tensor frame, if one came
};

// Builds a message; `peer` non-empty prepends the routing id (ROUTER side).
Message Encode(const std::string& peer, const wire::Envelope& env,
               std::optional<Frame> payload = std::nullopt);

// Parses a received message. `from_router` says whether frame 0 is a routing id.
// InvalidArgument with the reason on anything malformed.
absl::StatusOr<Decoded> Decode(Message msg, bool from_router);

// A Hello for this node.
wire::Envelope MakeHello(wire::NodeRole role, int rank);
// OK if `hello` has our magic, protocol version and hybridps version; else
// FailedPrecondition naming what differs. `receiver` names this side ("the scheduler").
absl::Status CheckHello(const wire::Hello& hello, absl::string_view receiver);
// "hybridps versions differ: A runs 0.1.0, B runs 0.2.0; every process ...".
std::string VersionsDiffer(absl::string_view side_a, absl::string_view version_a,
                           absl::string_view side_b, absl::string_view version_b);

// Checks a DataRequest and its payload: valid dtype and op, count*size without overflow
// and equal to the payload size when a payload is required or present.
absl::Status ValidateDataRequest(const wire::DataRequest& req,
                                 const std::optional<Frame>& payload);

wire::NodeRole ToWire(Role role);
// What Register carries of `options`: the settings that must agree across the job.
wire::JobSettings JobSettingsOf(const Options& options);
absl::string_view WireRoleName(wire::NodeRole role);

// An Envelope carrying `status` as an Error body, with request id `id`.
wire::Envelope MakeError(uint64_t id, const absl::Status& status);
absl::Status FromWire(const wire::Error& error);

}  // namespace hybridps

#endif  // HYBRIDPS_COMMON_WIRE_H_
