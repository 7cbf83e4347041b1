// OptimizerSpec <-> its wire form (common/hybridps.proto), for the server and the workers.
// Serialisation only; kept out of hybridps_optimizers so the rules stay free of protobuf.
#ifndef HYBRIDPS_OPTIMIZERS_SPEC_WIRE_H_
#define HYBRIDPS_OPTIMIZERS_SPEC_WIRE_H_

#include "absl/status/statusor.h"
#include "common/hybridps.pb.h"
#include "optimizers/update_rule.h"

namespace hybridps {
namespace optimizers {

void SpecToWire(const OptimizerSpec& spec, wire::OptimizerSpec* out);
// InvalidArgument for a schedule kind or warm-up mode this build does not know.
absl::StatusOr<OptimizerSpec> SpecFromWire(const wire::OptimizerSpec& spec);

}  // namespace optimizers
}  // namespace hybridps

#endif  // HYBRIDPS_OPTIMIZERS_SPEC_WIRE_H_
