// The executor of the dist_allreduce store (see allreduce_store.h): negotiation rounds,
// the collectives they decide, deadlines and stall warnings. Runs on "hps-ar-exec".
#include <algorithm>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/reduce.h"
#include "common/status.h"
#include "worker/allreduce/allreduce_op.h"
#include "worker/allreduce/allreduce_store.h"
#include "worker/comm/gloo_comm.h"

namespace hybridps {

namespace nego = negotiation;

namespace {

// The negotiation slot (bytes per rank in a round's allgather) of the next round: the
// largest message or room asked for (a direct two-shot's, ListDirectTwoShot) of the last
// kSlotHistory rounds, in whole pages (ExchangeSlotFor). Every rank computes it from the
// gathered lists' sizes and rooms, so slots always agree (a rank that sends each peer a
// message of its own asks for a room at least as large as each of them); a message larger
// than the slot still gets through (with an extra allgatherv). A short history: repeated
// rounds of one size fit, and a burst's large slot is not dragged through the small
// rounds that follow it (the ring sends whole slots). Shares ride with a tensor that
// comes back within it: a longer one (64 rounds) let tensors of a training step that
// happened to be alone in a round on one rank send shares their peers did not use.
constexpr size_t kSlotHistory = 2;
// Room for a round's eager payloads or two-shot halves (4 MiB per rank at most, see
// Options::eager_bytes and two_shot_bytes) and its list. A room is asked for only where
// the slot goes directly (GlooComm::kDirectSlotBytes).
constexpr size_t kMaxSlot = 5 << 20;
// The eager limit when allreduces run in shared memory (one host): above it the
// negotiation's copy of the payload to every peer costs more than the collective.
constexpr size_t kShmEagerBytes = 64 << 10;
// The largest CPU push_pull that is fused when allreduces run in shared memory: there a
// collective of its own costs a few microseconds, less than the fusion buffer's copies in
// and out of anything larger (Options::fusion_max_tensor_bytes applies below it).
constexpr size_t kShmFusionMaxTensorBytes = 128 << 10;
// The most names AllreduceStore::ran_alone_ remembers.
constexpr size_t kMaxRanAlone = 4096;

std::string Ranks(const std::vector<int>& ranks) {
  return absl::StrCat(ranks.size() == 1 ? "rank " : "ranks ", absl::StrJoin(ranks, ", "));
}

}  // namespace

void AllreduceStore::ExecLoop() {
  absl::Time claimed;
  while (WaitForRound(&claimed)) {
    if (!HoldRound(/*caller=*/false, claimed)) break;
  }
  // Nothing runs any more: fail what is left, and let the peers know at once.
  [[maybe_unused]] bool broken_ok;
  {
    absl::MutexLock lock(&mu_);
    // A waiting thread may still be in a round: the store broke, so it ends soon (Break
    // aborted the communicator); wait for it before the communicators go.
    mu_.Await(absl::Condition(
        +[](bool* busy) { return !*busy; }, &round_busy_));
    broken_ok = broken_.ok() || peers_left_;
    const absl::Status why =
        broken_.ok() ? absl::FailedPreconditionError("the store was shut down") : broken_;
    for (auto& [seq, op] : queued_) {
      op->handle->Complete(
          absl::Status(why.code(), absl::StrCat(op->Describe(), " failed: ", why.message())));
    }
    queued_.clear();
    for (auto& b : barriers_) b->Complete(why);
    barriers_.clear();
    exec_done_ = true;
  }
#if HYBRIDPS_WITH_NCCL
  CloseGpu(!broken_ok);
#endif
  comm_->Close();
  cpu_->Close();
  io_waker_.Wake();
}

absl::Time AllreduceStore::NextRoundLocked(bool caller) const {
  // While the last round left work pending somewhere (or we must announce leaving), a
  // round every cycle: what is submitted meanwhile is batched (and fused). Otherwise new
  // work starts a round at once (for the executor, while waiting threads run the rounds,
  // once they have had kCallerGrace to start it), and without any, a round every idle
  // tick (so a rank that never submits still joins the rounds of those waiting for it).
  const bool busy = job_active_ || stopping_;
  if (!busy && !queued_.empty()) {
    // GPU work is the executor's alone (ListHeads): a store that has GPU tensors does not
    // wait for callers.
    if (caller || !LeavesWorkToCallersLocked()) return absl::InfinitePast();
    return queued_.begin()->second->submitted + std::min(kCallerGrace, options_.cycle_time);
  }
  return last_round_ + (busy ? options_.cycle_time : idle_tick_);
}

bool AllreduceStore::WaitForRound(absl::Time* claimed) {
  absl::MutexLock lock(&mu_);
  while (true) {
    if (!broken_.ok()) return false;
    if (round_busy_) {  // a waiting thread runs rounds (HelpWith)
      round_free_cv_.Wait(&mu_);
      continue;
    }
    const absl::Time at = NextRoundLocked(/*caller=*/false);
    if (const absl::Time now = WallNow(); now >= at) {
      // New work nobody claimed within the grace: its submitter does not wait on it, so
      // later submissions wake the executor at once. (Not when no grace was offered:
      // a waiting thread declined, or the store has GPU tensors.)
      if (!job_active_ && !stopping_ && !queued_.empty() && LeavesWorkToCallersLocked()) {
        callers_active_ = false;
      }
      wake_ = false;
      ClaimRoundLocked(now);
      *claimed = now;
      return true;
    }
    if (job_active_ || stopping_) {
      // Until the round is due (a wake-up before it only looks again).
      wake_cv_.WaitWithDeadline(&mu_, at);
    } else {
      // With work queued, `at` is when the oldest of it is the executor's; without, within
      // kPollWindow of the last submission, the executor looks again each cycle. Until
      // then submissions leave it asleep (Submit): waking it would only compete with the
      // threads that wait on them.
      const absl::Time now = WallNow();
      exec_polling_ = LeavesWorkToCallersLocked() &&
                      (!queued_.empty() || now - last_submit_ < kPollWindow);
      if (!wake_) {
        exec_awaits_wake_ = true;
        wake_cv_.WaitWithDeadline(&mu_, exec_polling_ && queued_.empty()
                                            ? std::min(at, now + options_.cycle_time)
                                            : at);
        exec_awaits_wake_ = false;
      }
      exec_polling_ = false;
      wake_ = false;
    }
  }
}

void AllreduceStore::ClaimRoundLocked(absl::Time now) {
  round_busy_ = true;
  last_round_ = now;
}

bool AllreduceStore::HoldRound(bool caller, absl::Time claimed) {
  bool job_active = false;
  const bool ok = RunRound(caller, claimed, &job_active);
  // The operations are not the round's any more (the vector's memory stays for the next
  // round); those already completed and let go by their users are freed here, unlocked.
  listed_.clear();
  absl::MutexLock lock(&mu_);
  round_busy_ = false;
  round_free_cv_.Signal();
  job_active_ = job_active;
  if (queued_.empty()) declined_ = false;  // what a declining thread waited for is done
  // The executor may sleep until an idle tick computed before this round: what is left
  // is its work now (HelpWith runs only rounds due at once), so it re-reads the state.
  if (caller && (job_active || !queued_.empty())) WakeExecutorLocked();
  return ok;
}

void AllreduceStore::HelpWith(HandleState* state) {
  // Only a round that is due now: new work on a store whose last round left nothing
  // pending (an isolated operation, or the first of a burst before the executor woke).
  // The cycles of a busy store stay with the executor; a waiting thread that also slept
  // until each cycle was due measured 3-5 % slower on ResNet-50's 161 tensors.
  while (!state->DoneFast()) {
    absl::Time now;
    {
      absl::MutexLock lock(&mu_);
      callers_active_ = true;  // this thread waits on its operation
      if (round_busy_ && !stopping_ && broken_.ok()) {
        // The holder may be just finishing its round: on one core, the executor that
        // completed this thread's last operation is preempted by this thread before it
        // lets the round go. Wait a moment for it, rather than sleeping until the
        // operation completes and leaving the executor every round from now on.
        auto free = [this, state]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return !round_busy_ || !broken_.ok() || state->DoneFast();
        };
        mu_.AwaitWithTimeout(absl::Condition(&free), kCallerGrace);
        if (state->DoneFast()) return;
      }
      now = WallNow();
      if (round_busy_ || stopping_ || !broken_.ok() || now < NextRoundLocked(/*caller=*/true)) {
        // This thread sleeps until its operation completes: the executor must not leave
        // the operation to it (it runs its round as soon as one is due). Threads do wait
        // on their operations, so later ones are left to them again.
        if (!declined_) {
          declined_ = true;
          WakeExecutorLocked();
        }
        return;
      }
      ClaimRoundLocked(now);
      ++stats_.caller_rounds;
    }
    // False: the executor sees the store broken and stops.
    if (!HoldRound(/*caller=*/true, now)) return;
  }
}

void AllreduceStore::ExpireDeadlines(absl::Time now) {
  for (auto it = queued_.begin(); it != queued_.end();) {
    Op* op = it->second.get();
    if (op->deadline > now) {
      ++it;
      continue;
    }
    std::string why;
    std::vector<int> never;
    for (size_t r = 0; r < op->seen.size(); ++r) {
      if (!op->seen[r]) never.push_back(static_cast<int>(r));
    }
    if (!never.empty()) {
      why = absl::StrCat(": ", Ranks(never), " never submitted it");
    } else if (op->rounds_listed == 0) {
      why = ": an earlier operation on the same name never completed";
    } else {
      why = ": every rank submitted it, but not all at once (some gave up at their own "
            "deadline first)";
    }
    op->handle->Complete(absl::DeadlineExceededError(absl::StrCat(
        op->Describe(), " did not complete within ", absl::FormatDuration(options_.op_timeout),
        why)));
    it = queued_.erase(it);
  }
}

bool AllreduceStore::RunRound(bool caller, absl::Time now, bool* job_active) {
  verdict_awaited_ = false;
  std::vector<std::shared_ptr<Op>>& listed = listed_;
  nego::RankList& mine = mine_;
  std::vector<nego::RankList>& lists = lists_;
  mine.leaving = ListHeads(caller, now, &listed);
  ListMine(listed, now, &mine);
  // The negotiation runs from the round's start to the end of the exchange
  // (stats_.negotiating and the timeline's span).
  const absl::Time t0 = now;
  absl::Time t1;
  absl::Status failure = GatherLists(&mine, &lists, &t1);
  // The steady state's plan comes from the cache (negotiation.h, RoundCache).
  static const nego::Plan kNoPlan;
  const nego::Plan& plan = failure.ok() ? round_cache_.Decide(lists, rank_, fusion_bytes_,
                                                              fusion_max_tensor_bytes())
                                        : kNoPlan;
  if (!failure.ok()) round_cache_.Clear();  // the lists are unspecified now
  if (failure.ok()) {
    // Only rounds that decided something: a rank waiting for a slow peer runs a round
    // every cycle, which would fill the timeline.
    if (Recording(timeline_) && !plan.actions.empty()) {
      timeline_->Span(absl::StrCat("negotiation of ", plan.actions.size(), " actions"),
                      "negotiation", t0, t1, 1);
    }
    // The next round's receives now, while this one runs: the peers' next messages then
    // leave as soon as they are sent. Not when a rank leaves (there is no next round). A
    // failure here is the next round's (GlooComm keeps it): this round may still end
    // cleanly, e.g. with a peer that left after it.
    if (plan.leaving.empty() && !mine.leaving) cpu_->PostNextExchange(slot_bytes_);
    if (LogEnabled(LogLevel::DEBUG) && plan.any_entries) {
      size_t runs = 0;
      for (const nego::Action& a : plan.actions) runs += a.entries.size();
      HPS_LOG(DEBUG) << "round: listed " << listed.size() << " (next slot " << slot_bytes_
                     << " bytes), "
                     << plan.actions.size() << " actions for " << runs << " operations, "
                     << plan.missing.size() << " not ready here, " << plan.foreign.size()
                     << " not submitted here; negotiation " << absl::FormatDuration(t1 - t0);
    }
    failure = RunPlan(plan, listed);
    Warn(plan, listed, now);
  }
  if (failure.code() == absl::StatusCode::kUnavailable) AwaitPeerVerdict();
  absl::MutexLock lock(&mu_);
  ++stats_.rounds;
  stats_.cached_plans = round_cache_.plans_reused();
  stats_.largest_slot = std::max<uint64_t>(stats_.largest_slot, slot_bytes_);
  stats_.negotiating += t1 - t0;
  stats_.executing += WallNow() - t1;
  for (auto& op : listed) op->in_round = false;
  if (!failure.ok()) {
    BreakLocked(failure);
    return false;
  }
  *job_active = plan.pending;
  if (!plan.leaving.empty()) {
    if (mine.leaving) return false;
    peers_left_ = broken_.ok();
    if (peers_left_) HPS_LOG(INFO) << Ranks(plan.leaving) << " left the job";
    BreakLocked(absl::FailedPreconditionError(absl::StrCat(
        Ranks(plan.leaving), " left the job (shut down their store); no collective can run "
        "without ", plan.leaving.size() == 1 ? "it" : "them")));
    return false;
  }
  return true;
}

size_t AllreduceStore::eager_limit() const {
  // The eager probe (Start) may have lowered it for this job's links.
  const size_t copies = std::max(1, num_workers_ - 1);
  return std::min({options_.eager_bytes / copies, eager_cap_,
                   InSharedMemory() ? kShmEagerBytes : SIZE_MAX});
}

size_t AllreduceStore::fusion_max_tensor_bytes() const {
  return std::min(fusion_max_tensor_bytes_,
                  InSharedMemory() ? kShmFusionMaxTensorBytes : SIZE_MAX);
}

bool AllreduceStore::DirectTwoShots() const {
  return options_.direct_two_shot != 0 && cpu_ && cpu_->kind() == CpuCollectives::Kind::kGloo &&
         num_workers_ >= 3;
}

bool AllreduceStore::InSharedMemory() const {
  return cpu_ && cpu_->kind() == CpuCollectives::Kind::kSharedMemory;
}

bool AllreduceStore::ListHeads(bool caller, absl::Time now,
                               std::vector<std::shared_ptr<Op>>* listed) {
  absl::MutexLock lock(&mu_);
  ExpireDeadlines(now);
  // Several operations on one name: only the oldest (a lone one needs no lookup).
  absl::flat_hash_map<absl::string_view, bool> heads;
  const bool several = queued_.size() > 1;
  for (auto& [seq, op] : queued_) {
    if (several && !heads.try_emplace(op->name, true).second) continue;  // not the oldest
    // GPU work needs the executor's thread (its CUDA device, the NCCL communicator): a
    // waiting thread's round leaves it for a later one.
    if (caller && op->in.device == Device::kGPU) continue;
    op->in_round = true;
    ++op->rounds_listed;
    listed->push_back(op);
  }
  return stopping_ && queued_.empty();
}

void AllreduceStore::ListMine(const std::vector<std::shared_ptr<Op>>& listed, absl::Time now,
                              nego::RankList* mine) {
  // Operations carry their data in the negotiation message (eagerly) when that is cheaper
  // than negotiating and then running the ring (Options::eager_bytes). Each rank receives
  // n-1 copies where the ring moves 2(n-1)/n of the tensor, so a tensor goes eagerly up to
  // eager_bytes / (n-1) bytes: with 2 ranks the same bytes as the ring, in one step instead
  // of an exchange and two ring steps; with more ranks the extra bytes stay under
  // eager_bytes per round. A round carries at most twice that per rank. An operation runs
  // eagerly when every rank sent its data in the same round; otherwise it takes the
  // allreduce.
  // In shared memory on one node the allreduce is cheaper than the eager path's copies
  // above kShmEagerBytes.
  const size_t eager_tensor = eager_limit();
  const size_t eager_round = 2 * eager_tensor;
  // With 2 ranks, larger push_pulls up to two_shot_bytes are two-shots (negotiation.h):
  // each rank sends the other's half along, and the summed halves are swapped. The same
  // bytes as the ring, in two exchanges instead of three (the negotiation's, and the ring's
  // reduce-scatter and all-gather). A round carries at most half of that per rank.
  const size_t two_shot_bytes =
      num_workers_ == 2 && cpu_->kind() == CpuCollectives::Kind::kGloo
          ? options_.two_shot_bytes
          : 0;
  size_t eager_bytes = 0;
  // The entries of the last round are reused (their names' memory): every field is set.
  mine->entries.resize(listed.size());
  for (size_t i = 0; i < listed.size(); ++i) {
    const std::shared_ptr<Op>& op = listed[i];
    nego::Entry& e = mine->entries[i];
    e.name.assign(op->name);
    e.occurrence = op->occurrence;
    e.kind = op->kind;
    e.dtype = op->in.dtype;
    e.count = op->in.count;
    e.shape = op->in.shape;
    e.root = op->root;
    e.priority = op->priority;
    // `now` is when the round was claimed: an operation submitted since is of age 0.
    e.age_ms = static_cast<uint32_t>(std::clamp<int64_t>(
        absl::ToInt64Milliseconds(now - op->submitted), 0, UINT32_MAX));
    const size_t bytes = op->in.bytes();
    // Data goes along only the first time an operation is listed: when the ranks are in
    // step that is the round that runs it; a rank waiting for late peers does not resend.
    // GPU data never does: it is not in host memory.
    e.gpu = op->in.device == Device::kGPU;
    e.phase = 0;
    e.has_payload = false;
    e.payload_offset = 0;
    e.payload = {};
    const bool first_time = !e.gpu && op->rounds_listed == 1;
    if (first_time && (op->kind == nego::OpKind::kPushPull || op->root == rank_) &&
        bytes <= eager_tensor && eager_bytes + bytes <= eager_round) {
      e.has_payload = true;
      e.payload = absl::string_view(static_cast<const char*>(op->in.data), bytes);
      eager_bytes += bytes;
    } else if (first_time && op->kind == nego::OpKind::kPushPull && bytes > eager_tensor &&
               bytes <= two_shot_bytes) {
      const Chunk c = ChunkOf(op->in.count, 1 - rank_, 2);
      const size_t es = DTypeSize(op->in.dtype);
      const size_t half = (c.end - c.begin) * es;
      if (eager_bytes + half <= two_shot_bytes / 2) {
        e.has_payload = true;
        e.payload_offset = c.begin;
        e.payload =
            absl::string_view(static_cast<const char*>(op->in.data) + c.begin * es, half);
        eager_bytes += half;
      }
    }
  }
  ListDirectTwoShot(listed, eager_tensor, mine);
}

void AllreduceStore::ListDirectTwoShot(const std::vector<std::shared_ptr<Op>>& listed,
                                       size_t eager_tensor, nego::RankList* mine) {
  // With 3 to 8 workers over Gloo, a push_pull that goes directly sends its first step
  // with the negotiation: each peer gets a message of its own with its share
  // (GatherLists), and the plan makes it a two-shot when every rank did so. Only for this
  // rank's only direct push_pull of the round (several are fused into one allreduce)
  // whose last occurrence also ran alone and directly on every rank (ran_alone_): the
  // shares of a rank whose peers then run it otherwise are sent for nothing. The message
  // must fit the round's slot, which every rank computes from the rooms asked for in the
  // last rounds.
  scattered_.reset();
  mine->room = 0;
  const int n = num_workers_;
  if (!DirectTwoShots()) return;
  size_t lone = SIZE_MAX;
  int direct = 0;
  for (size_t i = 0; i < listed.size(); ++i) {
    const Op& op = *listed[i];
    const size_t bytes = op.in.bytes();
    if (op.kind != nego::OpKind::kPushPull || op.in.device != Device::kCPU ||
        mine->entries[i].has_payload || bytes <= eager_tensor || !cpu_->GoesDirect(bytes)) {
      continue;
    }
    ++direct;
    lone = i;
  }
  if (direct != 1) return;
  const Op& op = *listed[lone];
  // Data goes along only the first time (ListMine), and every share holds an element (a
  // payload is never empty).
  if (op.rounds_listed != 1 || op.in.count < static_cast<uint64_t>(n)) return;
  const Chunk largest = ChunkOf(op.in.count, 0, n);
  const size_t share = (largest.end - largest.begin) * DTypeSize(op.in.dtype);
  // The largest message to a peer (the first rank's share is the largest): what the slot
  // must hold, asked for only where such a slot still goes directly.
  const size_t want = nego::SerializedBytes(*mine) + (share + 7) / 8 * 8;
  if (!cpu_->ExchangesPerPeer(ExchangeSlotFor(sizeof(uint64_t) + want))) return;
  mine->room = want;
  if (!ran_alone_.contains(op.name) || sizeof(uint64_t) + want > slot_bytes_ ||
      !cpu_->ExchangesPerPeer(slot_bytes_)) {
    return;  // the next rounds' slot will have room
  }
  scattered_ = lone;
}

absl::Status AllreduceStore::GatherLists(nego::RankList* mine,
                                         std::vector<nego::RankList>* lists, absl::Time* t1) {
  // The eager payloads are copied into the message: in shared memory straight into this
  // rank's exchange area; otherwise into a buffer kept from round to round, framed for
  // AllgatherFramed (8 bytes for the length, then the message), and sent from there. With
  // a direct two-shot's shares, each peer's message is written into a slot of its own.
  const absl::Span<char> room = cpu_->ExchangeRoom();
  absl::Status exchanged;
  if (scattered_) {
    char* const per_peer = cpu_->PerPeerRoom(slot_bytes_);  // ListDirectTwoShot checked
    nego::Entry& e = mine->entries[*scattered_];
    const char* const data = static_cast<const char*>(listed_[*scattered_]->in.data);
    const size_t es = DTypeSize(e.dtype);
    per_peer_bytes_.assign(num_workers_, 0);
    for (int r = 0; r < num_workers_; ++r) {
      if (r == rank_) continue;
      const Chunk c = ChunkOf(e.count, r, num_workers_);
      e.has_payload = true;
      e.payload_offset = c.begin;
      e.payload = absl::string_view(data + c.begin * es, (c.end - c.begin) * es);
      per_peer_bytes_[r] = nego::SerializedBytes(*mine);
      // Every rank computes the next slot from what it received: this message must not
      // be larger than the room this rank asked for (ListDirectTwoShot).
      if (per_peer_bytes_[r] > mine->room) {
        return absl::InternalError(absl::StrCat("negotiation: a message of ",
                                                per_peer_bytes_[r], " bytes for rank ", r,
                                                " over the room of ", mine->room));
      }
      nego::SerializeTo(*mine, rank_, per_peer + r * slot_bytes_ + sizeof(uint64_t));
    }
    exchanged = cpu_->ExchangePerPeer(per_peer_bytes_, slot_bytes_, gloo_timeout_, &gathered_);
  } else if (const size_t bytes = nego::SerializedBytes(*mine); bytes <= room.size()) {
    nego::SerializeTo(*mine, rank_, room.data());
    exchanged = cpu_->ExchangeWritten(bytes, slot_bytes_, gloo_timeout_, &gathered_);
  } else {
    msg_.resize(sizeof(uint64_t) + bytes);  // the length is AllgatherFramed's to write
    nego::SerializeTo(*mine, rank_, msg_.data() + sizeof(uint64_t));
    exchanged = cpu_->Exchange(&msg_, slot_bytes_, gloo_timeout_, &gathered_);
  }
  *t1 = WallNow();
  RETURN_IF_ERROR(exchanged);
  // The next slot holds every rank's message, and the room a rank asked for.
  size_t largest = 0, asked = 0;
  lists->resize(num_workers_);
  for (int r = 0; r < num_workers_; ++r) {
    RETURN_IF_ERROR(round_cache_.Parse(gathered_[r], r, &(*lists)[r]));
    largest = std::max(largest, gathered_[r].size());
    asked = std::max(asked, static_cast<size_t>(std::min<uint64_t>((*lists)[r].room, kMaxSlot)));
  }
  // The next slot, from data every rank holds.
  recent_sizes_.push_back(std::max(largest, asked) + sizeof(uint64_t));
  if (recent_sizes_.size() > kSlotHistory) recent_sizes_.pop_front();
  const size_t want = *std::max_element(recent_sizes_.begin(), recent_sizes_.end());
  slot_bytes_ = std::clamp(ExchangeSlotFor(want), kMinSlotBytes, kMaxSlot);
  return absl::OkStatus();
}

absl::Status AllreduceStore::RunPlan(const nego::Plan& plan,
                                     const std::vector<std::shared_ptr<Op>>& listed) {
  absl::Status failure;
  for (const nego::Action& a : plan.actions) {
    if (!failure.ok()) break;
    const bool recording = Recording(timeline_);  // once: StartTimeline may come meanwhile
    const absl::Time start = recording ? WallNow() : absl::InfinitePast();
    if (recording && a.type != nego::Action::Type::kFail) {
      for (size_t i : a.entries) {  // from its submission until every rank had it
        const Op* op = listed[i].get();
        timeline_->Span(absl::StrCat("'", op->name, "'"), "wait for data", op->submitted,
                        start, 2);
      }
    }
    failure = Execute(a, listed);
    if (recording && a.type != nego::Action::Type::kFail) {
      static constexpr const char* kKind[] = {"eager", "two-shot", "allreduce", "broadcast",
                                              "fail"};
      const Op* first = listed[a.entries[0]].get();
      size_t bytes = 0;
      for (size_t i : a.entries) bytes += listed[i]->in.bytes();
      timeline_->Span(a.entries.size() == 1
                          ? absl::StrCat(kKind[static_cast<int>(a.type)], " of '", first->name,
                                         "'")
                          : absl::StrCat(kKind[static_cast<int>(a.type)], " of ",
                                         a.entries.size(), " tensors from '", first->name, "'"),
                      "collective", start, WallNow(), 1,
                      absl::StrCat("\"bytes\": ", bytes, ", \"tensors\": ", a.entries.size()));
    }
  }
#if HYBRIDPS_WITH_NCCL
  failure = FinishGpu(failure);
#endif
  for (const nego::Missing& m : plan.missing) {
    Op* op = listed[m.entry].get();
    std::vector<bool> seen(num_workers_, true);
    for (int r : m.ranks) seen[r] = false;
    if (op->seen.empty()) op->seen = seen;
    for (int r = 0; r < num_workers_; ++r) op->seen[r] = op->seen[r] || seen[r];
  }
  return failure;
}

absl::Status AllreduceStore::ExplainFailure(absl::Status s) {
  if (s.ok()) return s;
  if (s.code() == absl::StatusCode::kUnavailable) AwaitPeerVerdict();
  absl::MutexLock lock(&mu_);
  // The store broke (a peer died, the scheduler is gone): Break shut the connections, so
  // Gloo's "connection closed" is a symptom; the operation fails with the cause.
  if (!broken_.ok() && !peers_left_) return broken_;
  return s;
}

void AllreduceStore::AwaitPeerVerdict() {
  if (verdict_awaited_) return;  // once per round
  verdict_awaited_ = true;
  // Gloo only says that a connection closed, to an address. When the peer died, the
  // scheduler names it (NodeFailed -> Break) within the heartbeat timeout; the operations
  // then fail with that, so users read which rank died instead of a socket address.
  const absl::Duration wait = options_.heartbeat_timeout + 2 * options_.heartbeat_interval;
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(+[](absl::Status* b) { return !b->ok(); }, &broken_),
                       wait);
}

void AllreduceStore::Finish(Op* op, absl::Status status, uint64_t Stats::*counter) {
  if (!status.ok() && !absl::StrContains(status.message(), absl::StrCat("'", op->name, "'"))) {
    status = absl::Status(status.code(),
                          absl::StrCat(op->Describe(), " failed: ", status.message()));
  }
  if (Recording(timeline_)) {
    timeline_->Span(op->Describe(), status.ok() ? "operation" : "failed operation",
                    op->submitted, WallNow(), 0,
                    absl::StrCat("\"bytes\": ", op->in.bytes()));
  }
  absl::MutexLock lock(&mu_);
  if (counter != nullptr) ++(stats_.*counter);
  op->in_round = false;
  op->handle->Complete(std::move(status));
  queued_.erase(op->seq);
}

absl::Status AllreduceStore::Execute(const nego::Action& a,
                                     const std::vector<std::shared_ptr<Op>>& listed) {
  Op* first = listed[a.entries[0]].get();
#if HYBRIDPS_WITH_NCCL
  // Decide never mixes devices in an action, and GPU tensors are never eager.
  if (a.type != nego::Action::Type::kFail && first->in.device == Device::kGPU) {
    return ExecuteGpu(a, listed);
  }
#endif
  const size_t es = DTypeSize(a.dtype);
  switch (a.type) {
    case nego::Action::Type::kFail:
      Finish(first, a.error);
      return absl::OkStatus();
    case nego::Action::Type::kEager: {
      const size_t bytes = first->in.bytes();
      if (bytes > 0 && (first->kind == nego::OpKind::kPushPull || rank_ != first->root)) {
        // One pass for the first two (the payloads are in the communicator's buffers,
        // never the output); the same order, so the same bits, on every rank.
        if (a.payloads.size() >= 2) {
          Sum2(a.dtype, first->out.data, a.payloads[0].data(), a.payloads[1].data(),
               first->in.count);
        } else {
          std::memcpy(first->out.data, a.payloads[0].data(), bytes);
        }
        for (size_t r = 2; r < a.payloads.size(); ++r) {
          SumInto(a.dtype, first->out.data, a.payloads[r].data(), first->in.count);
        }
      }
      if (DirectTwoShots()) NoteRun(first->name, false);
      return FinishCounted(first, absl::OkStatus(), &Stats::eager);
    }
    case nego::Action::Type::kTwoShot:
      return ExecuteTwoShot(a, first);
    case nego::Action::Type::kBroadcast: {
      const absl::Status s = cpu_->Broadcast(a.dtype, first->out.data, first->out.count,
                                             first->root, gloo_timeout_);
      return FinishCounted(first, s, &Stats::broadcasts);
    }
    case nego::Action::Type::kAllreduce:
      break;
  }
  absl::Status s;
  auto allreduce = [&](const void* in, void* out, size_t count) {
    return cpu_->Allreduce(a.dtype, in, out, count, gloo_timeout_);
  };
  if (a.entries.size() == 1) {
    s = allreduce(first->in.data, first->out.data, first->in.count);
  } else {
    // Pack, reduce once, unpack.
    if (fusion_.size() < a.total_count * es) fusion_.resize(a.total_count * es);
    const absl::Time packing = Recording(timeline_) ? WallNow() : absl::InfinitePast();
    size_t offset = 0;
    for (size_t i : a.entries) {
      const Op* op = listed[i].get();
      if (op->in.count > 0) std::memcpy(fusion_.data() + offset, op->in.data, op->in.bytes());
      offset += op->in.bytes();
    }
    const absl::Time packed = Recording(timeline_) ? WallNow() : absl::InfinitePast();
    s = allreduce(fusion_.data(), fusion_.data(), a.total_count);
    const absl::Time reduced = Recording(timeline_) ? WallNow() : absl::InfinitePast();
    offset = 0;
    for (size_t i : a.entries) {
      Op* op = listed[i].get();
      if (s.ok() && op->out.count > 0) {
        std::memcpy(op->out.data, fusion_.data() + offset, op->out.bytes());
      }
      offset += op->out.bytes();
    }
    if (Recording(timeline_)) {
      const std::string args = absl::StrCat("\"bytes\": ", offset, ", \"tensors\": ",
                                            a.entries.size());
      timeline_->Span("into the fusion buffer", "fusion copy", packing, packed, 1, args);
      if (s.ok()) {
        timeline_->Span("out of the fusion buffer", "fusion copy", reduced, WallNow(), 1,
                        args);
      }
    }
  }
  s = ExplainFailure(s);
  const bool direct = cpu_->GoesDirect(a.total_count * es);
  if (DirectTwoShots()) {
    for (size_t i : a.entries) NoteRun(listed[i]->name, direct && a.entries.size() == 1);
  }
  {
    absl::MutexLock lock(&mu_);
    ++stats_.allreduces;
    if (cpu_->in_shared_memory()) ++stats_.shm_allreduces;
    if (direct) ++stats_.direct_allreduces;
    if (a.entries.size() > 1) stats_.fused_tensors += a.entries.size();
  }
  for (size_t i : a.entries) Finish(listed[i].get(), s);
  return s;
}

absl::Status AllreduceStore::ExecuteTwoShot(const nego::Action& a, Op* op) {
  const int n = num_workers_;
  const size_t es = DTypeSize(a.dtype);
  const Chunk own = ChunkOf(op->in.count, rank_, n);
  const size_t m = own.end - own.begin;
  const char* in = static_cast<const char*>(op->in.data) + own.begin * es;
  char* sum = static_cast<char*>(op->out.data) + own.begin * es;
  // The peers' summed chunks arrive straight into the output while this rank sums its own
  // (each chunk is summed by one rank, so every rank gets the same bits). In place, the
  // input's copies of the peers' chunks already left with the negotiation. With 2 ranks
  // in rank order; with more as the direct allreduce sums (this rank's copy first, then
  // the others' in rank order), so that both give the same bits.
  auto fill = [&] {
    if (m == 0) return;
    if (n == 2) {
      const void* other = a.payloads[1 - rank_].data();
      Sum2(a.dtype, sum, rank_ == 0 ? in : other, rank_ == 0 ? other : in, m);
      return;
    }
    const int first = rank_ == 0 ? 1 : 0;
    Sum2(a.dtype, sum, in, a.payloads[first].data(), m);
    for (int r = first + 1; r < n; ++r) {
      if (r != rank_) SumInto(a.dtype, sum, a.payloads[r].data(), m);
    }
  };
  const absl::Status s = comm_->ShareChunks(a.dtype, op->out.data, op->in.count, fill,
                                            gloo_timeout_);
  if (n > 2) NoteRun(op->name, /*alone_and_direct=*/true);
  return FinishCounted(op, s, &Stats::two_shots);
}

void AllreduceStore::NoteRun(const std::string& name, bool alone_and_direct) {
  if (alone_and_direct) {
    // Bounded (names that never come back): every rank forgets at the same point, as
    // every rank runs the same plans.
    if (ran_alone_.size() >= kMaxRanAlone && !ran_alone_.contains(name)) ran_alone_.clear();
    ran_alone_.insert(name);
  } else {
    ran_alone_.erase(name);
  }
}

absl::Status AllreduceStore::FinishCounted(Op* op, absl::Status s, uint64_t Stats::*counter) {
  s = ExplainFailure(s);
  Finish(op, s, counter);
  return s;
}

void AllreduceStore::Warn(const nego::Plan& plan, const std::vector<std::shared_ptr<Op>>& listed,
                          absl::Time now) {
  if (plan.missing.empty() && plan.foreign.empty() && foreign_warned_.empty()) return;
  for (const nego::Missing& m : plan.missing) {
    Op* op = listed[m.entry].get();
    if (now < op->next_warning) continue;
    op->next_warning = now + options_.stall_warning;
    HPS_LOG(WARNING) << op->Describe() << " has waited "
                     << absl::FormatDuration(
                            absl::Trunc(now - op->submitted, absl::Milliseconds(1)))
                     << "; not submitted by " << Ranks(m.ranks) << " (it fails at its deadline, "
                     << absl::FormatDuration(options_.op_timeout) << ")";
  }
  absl::flat_hash_map<std::string, absl::Time> seen;
  for (const nego::Foreign& f : plan.foreign) {
    auto it = foreign_warned_.find(f.name);
    absl::Time next = it == foreign_warned_.end() ? absl::InfinitePast() : it->second;
    if (absl::Milliseconds(f.max_age_ms) >= options_.stall_warning && now >= next) {
      next = now + options_.stall_warning;
      HPS_LOG(WARNING) << nego::OpKindName(f.kind) << " of '" << f.name << "' submitted by "
                       << Ranks(f.ranks) << " has waited "
                       << absl::FormatDuration(absl::Milliseconds(f.max_age_ms))
                       << " for this rank (" << rank_ << "), which has not submitted it";
    }
    seen[f.name] = next;
  }
  foreign_warned_ = std::move(seen);
}

}  // namespace hybridps
