#include "worker/allreduce/eager_probe.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/status.h"

namespace hybridps {
namespace {

// The operation's list rides beside an eager payload in the negotiation's message.
constexpr size_t kListRoom = 256;
// How much slower than the timed allreduce eager may be and still count as a gain: on
// emulated 1 Gbit/s links with 4 workers 85 KiB timed 1.03x the allreduce, while in the
// rounds 64 KiB ran eagerly at half the time of the allreduce path.
constexpr double kEagerEdge = 0.1;

// The slot of an exchange of `message_bytes`, as a round sizes it.
size_t SlotFor(size_t message_bytes) { return ExchangeSlotFor(message_bytes + sizeof(uint64_t)); }

std::string Size(size_t bytes) {
  return bytes % (1 << 20) == 0 ? absl::StrCat(bytes >> 20, " MiB")
         : bytes % 1024 == 0    ? absl::StrCat(bytes >> 10, " KiB")
                                : absl::StrCat(bytes, " B");
}

}  // namespace

std::string EagerProbe::Describe() const {
  std::vector<std::string> parts;
  for (const Timing& t : timings) {
    parts.push_back(absl::StrFormat("%s eager %.0f us / allreduce %.0f us",
                                    Size(t.bytes), t.eager_us, t.allreduce_us));
  }
  return absl::StrJoin(parts, "; ");
}

absl::StatusOr<EagerProbe> ProbeEagerLimit(CpuCollectives* cpu, size_t largest, int reps,
                                           absl::Duration timeout) {
  EagerProbe probe;
  largest = largest / sizeof(float) * sizeof(float);
  // Largest first as halvings of it, then timed from the smallest up.
  std::vector<size_t> sizes;
  for (size_t b = largest; b >= EagerProbe::kSmallest;
       b = b / 2 / sizeof(float) * sizeof(float)) {
    sizes.insert(sizes.begin(), b);
  }
  std::vector<float> data(largest / sizeof(float));
  std::string msg;  // framed as the exchange takes it: 8 bytes of room, then the message
  std::vector<absl::string_view> gathered;
  // One operation; the next one's exchange is posted when it ends (`next_slot`, 0: none),
  // as a round posts the next round's receives.
  auto run = [&](size_t bytes, bool eager, size_t next_slot) -> absl::Status {
    msg.assign(sizeof(uint64_t) + kListRoom, '\0');
    if (eager) msg.append(reinterpret_cast<const char*>(data.data()), bytes);
    RETURN_IF_ERROR(cpu->Exchange(
        &msg, eager ? SlotFor(bytes + kListRoom) : SlotFor(kListRoom), timeout, &gathered));
    if (!eager) {
      RETURN_IF_ERROR(cpu->Allreduce(DType::kFloat32, data.data(), data.data(),
                                     bytes / sizeof(float), timeout));
    }
    if (next_slot > 0) cpu->PostNextExchange(next_slot);
    return absl::OkStatus();
  };
  // Per size: one sample of each way to warm up, then `reps` of each in turn; a sample is
  // kRun operations back to back, as a training step sends them (so that a link that
  // lets a burst through fast, as a shaped one does, is timed at its steady rate), and
  // each way's time is its fastest sample's mean (the scheduler only ever adds time).
  // After each size rank 0 says whether to go on: not once eager clearly lost (the summed
  // gain fell 1 below its peak).
  constexpr int kRun = 4;
  int64_t limit = static_cast<int64_t>(EagerProbe::kSmallest);
  double gain = 0, best = 0;
  for (size_t k = 0; k < sizes.size(); ++k) {
    const size_t bytes = sizes[k];
    const size_t eager_slot = SlotFor(bytes + kListRoom), small_slot = SlotFor(kListRoom);
    double eager_us = 1e300, allreduce_us = 1e300;
    for (int sample = 0; sample < 2 * (reps + 1); ++sample) {
      const bool eager = sample % 2 == 0;
      const absl::Time t0 = absl::Now();
      for (int i = 0; i < kRun; ++i) {
        // The last operation of the last sample leaves nothing posted: a broadcast comes
        // next, and when rank 0 stops there, receives left posted would fail the store's
        // first round (its slot differs).
        const bool last = sample + 1 == 2 * (reps + 1) && i + 1 == kRun;
        const bool next_eager = i + 1 < kRun ? eager : !eager;
        RETURN_IF_ERROR(run(bytes, eager, last ? 0 : next_eager ? eager_slot : small_slot));
      }
      const double us = absl::ToDoubleMicroseconds(absl::Now() - t0) / kRun;
      double& fastest = eager ? eager_us : allreduce_us;
      if (sample >= 2) fastest = std::min(fastest, us);
    }
    probe.timings.insert(probe.timings.begin(),
                         EagerProbe::Timing{bytes, eager_us, allreduce_us});
    // Each size's gain from going eagerly (its share of the allreduce's time saved,
    // negative where eager was slower), summed from the smallest size up: the limit is
    // the size at which the sum peaks. One noisy size moves it little. Eager gets an edge
    // of kEagerEdge: a round's allreduce costs more than the bare one timed here (the
    // fusion buffer's copies in and out).
    int64_t go_on = 1;
    if (bytes > EagerProbe::kSmallest) {
      gain += 1 + kEagerEdge - eager_us / std::max(allreduce_us, 1e-3);
      if (gain > best) {
        best = gain;
        limit = static_cast<int64_t>(bytes);
      }
      go_on = gain > best - 1 ? 1 : 0;
    }
    if (k + 1 == sizes.size()) break;
    RETURN_IF_ERROR(cpu->Broadcast(DType::kInt64, &go_on, 1, /*root=*/0, timeout));
    if (go_on == 0) break;
  }
  RETURN_IF_ERROR(cpu->Broadcast(DType::kInt64, &limit, 1, /*root=*/0, timeout));
  if (limit < static_cast<int64_t>(EagerProbe::kSmallest) ||
      limit > static_cast<int64_t>(largest)) {
    return absl::DataLossError(absl::StrCat("the eager probe: rank 0 chose ", limit,
                                            " bytes, outside [", EagerProbe::kSmallest, ", ",
                                            largest, "]"));
  }
  probe.limit = static_cast<size_t>(limit);
  return probe;
}

}  // namespace hybridps
