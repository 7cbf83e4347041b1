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

// Exchange slots grow in pages, as the store's rounds size them; the list of the operation
// rides beside an eager payload, hence the room above it.
constexpr size_t kSlotGrain = 4096;
constexpr size_t kListRoom = 256;

size_t SlotFor(size_t message_bytes) {
  return std::max(kSlotGrain,
                  (message_bytes + sizeof(uint64_t) + kSlotGrain - 1) / kSlotGrain * kSlotGrain);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

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
  std::vector<float> data(largest / sizeof(float));
  std::string msg;  // framed as the exchange takes it: 8 bytes of room, then the message
  // The operations in the order every rank runs them: per size, one of each to warm up,
  // then `reps` of each in turn. Each exchange's receives are posted when the operation
  // before it ends, as a round posts the next round's, except the first one's.
  struct Step {
    size_t bytes;
    bool eager;
    bool timed;
  };
  std::vector<Step> steps;
  std::vector<size_t> sizes;
  for (size_t b = largest; b >= EagerProbe::kSmallest;
       b = b / 2 / sizeof(float) * sizeof(float)) {
    sizes.push_back(b);
    for (int i = 0; i < reps + 1; ++i) {
      steps.push_back(Step{b, true, i > 0});
      steps.push_back(Step{b, false, i > 0});
    }
  }
  auto slot_of = [&](const Step& s) {
    return s.eager ? SlotFor(s.bytes + kListRoom) : SlotFor(kListRoom);
  };
  std::vector<std::vector<double>> eager_us(sizes.size()), allreduce_us(sizes.size());
  size_t size_index = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    const Step& s = steps[i];
    if (i > 0 && s.bytes != steps[i - 1].bytes) ++size_index;
    msg.assign(sizeof(uint64_t) + kListRoom, '\0');
    if (s.eager) msg.append(reinterpret_cast<const char*>(data.data()), s.bytes);
    const absl::Time t0 = absl::Now();
    RETURN_IF_ERROR(cpu->Exchange(&msg, slot_of(s), timeout).status());
    if (!s.eager) {
      RETURN_IF_ERROR(cpu->Allreduce(DType::kFloat32, data.data(), data.data(),
                                     s.bytes / sizeof(float), timeout));
    }
    const double us = absl::ToDoubleMicroseconds(absl::Now() - t0);
    if (s.timed) (s.eager ? eager_us : allreduce_us)[size_index].push_back(us);
    if (i + 1 < steps.size()) cpu->PostNextExchange(slot_of(steps[i + 1]));
  }
  int64_t limit = static_cast<int64_t>(EagerProbe::kSmallest);
  for (size_t k = 0; k < sizes.size(); ++k) {
    probe.timings.push_back(
        EagerProbe::Timing{sizes[k], Median(eager_us[k]), Median(allreduce_us[k])});
  }
  // From the smallest size up, each size's gain from going eagerly (its share of the
  // allreduce's time saved, negative where eager was slower), summed: the limit is the size
  // at which the sum peaks. One noisy size moves it little (a lone win above sizes that
  // lost does not outweigh their losses), and where eager won everywhere it is the largest.
  double gain = 0, best = 0;
  for (size_t k = sizes.size(); k-- > 0;) {
    const EagerProbe::Timing& t = probe.timings[k];
    if (t.bytes == EagerProbe::kSmallest) continue;  // eager at any rate
    gain += 1 - t.eager_us / std::max(t.allreduce_us, 1e-3);
    if (gain > best) {
      best = gain;
      limit = static_cast<int64_t>(t.bytes);
    }
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
