// hybridps-optimizer-check: runs an update rule over given data, for comparison with
// MXNet (tests/optimizers/test_against_mxnet.py).
//
//   hybridps-optimizer-check SPEC WEIGHTS GRADS OUT
//
// SPEC is a text file, one "key value" per line ('#' starts a comment):
//   rule NAME                  optimizer name (required)
//   param NAME VALUE           a hyper-parameter (repeatable)
//   multi_precision 0|1        float32 master copy for 16-bit weights
//   dtype float32|float16|bfloat16
//   count N                    elements (required)
//   steps N                    updates (required)
//   partitions K               split the tensor into K partitions (default 1)
//   lr_mult X, wd_mult X       the key's multipliers (default 1)
//   schedule KIND              none, factor, multifactor, poly, cosine
//   schedule.FIELD VALUE       an LrSchedule field by name (steps: comma-separated)
// WEIGHTS holds `count` float32 (rounded to dtype), GRADS steps * count float32 (each
// step's gradient, rounded to dtype), all raw little-endian. OUT receives steps * count
// float32: the stored weights after every step. Update t runs at num_update = t.
// Exit status 0 on success, 1 on a bad spec or file (with a message on stderr).
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/dtype.h"
#include "optimizers/update_rule.h"
#include "tests/optimizers/test_util.h"

namespace hybridps {
namespace optimizers {
namespace {

struct CheckSpec {
  OptimizerSpec spec;
  DType dtype = DType::kFloat32;
  size_t count = 0;
  int64_t steps = 0;
  size_t partitions = 1;
  double lr_mult = 1;
  double wd_mult = 1;
};

absl::Status Bad(absl::string_view what) { return absl::InvalidArgumentError(what); }

template <typename T>
absl::Status ParseNumber(const std::string& s, T* out) {
  if constexpr (std::is_same_v<T, double>) {
    if (absl::SimpleAtod(s, out)) return absl::OkStatus();
  } else {
    if (absl::SimpleAtoi(s, out)) return absl::OkStatus();
  }
  return Bad(absl::StrCat("not a number: '", s, "'"));
}

absl::Status SetScheduleField(LrSchedule* s, const std::string& field, const std::string& v) {
  if (field == "base_lr") return ParseNumber(v, &s->base_lr);
  if (field == "warmup_steps") return ParseNumber(v, &s->warmup_steps);
  if (field == "warmup_begin_lr") return ParseNumber(v, &s->warmup_begin_lr);
  if (field == "warmup_mode") {
    if (v != "linear" && v != "constant") return Bad("warmup_mode: linear or constant");
    s->warmup_mode = v == "linear" ? WarmupMode::kLinear : WarmupMode::kConstant;
    return absl::OkStatus();
  }
  if (field == "step") return ParseNumber(v, &s->step);
  if (field == "factor") return ParseNumber(v, &s->factor);
  if (field == "stop_factor_lr") return ParseNumber(v, &s->stop_factor_lr);
  if (field == "steps") {
    s->steps.clear();
    for (absl::string_view part : absl::StrSplit(v, ',')) {
      int64_t x = 0;
      if (absl::Status st = ParseNumber(std::string(part), &x); !st.ok()) return st;
      s->steps.push_back(x);
    }
    return absl::OkStatus();
  }
  if (field == "max_update") return ParseNumber(v, &s->max_update);
  if (field == "final_lr") return ParseNumber(v, &s->final_lr);
  if (field == "pwr") return ParseNumber(v, &s->pwr);
  return Bad(absl::StrCat("unknown schedule field '", field, "'"));
}

absl::Status ParseSpec(const std::string& path, CheckSpec* c) {
  std::ifstream in(path);
  if (!in) return Bad(absl::StrCat("cannot read ", path));
  std::string line;
  while (std::getline(in, line)) {
    line = line.substr(0, line.find('#'));
    std::istringstream words(line);
    std::string key;
    std::string value;
    if (!(words >> key)) continue;
    if (key == "param") {
      std::string name;
      double v = 0;
      if (!(words >> name >> value)) return Bad("param needs a name and a value");
      if (absl::Status s = ParseNumber(value, &v); !s.ok()) return s;
      c->spec.params[name] = v;
      continue;
    }
    if (!(words >> value)) return Bad(absl::StrCat("'", key, "' needs a value"));
    absl::Status s;
    if (key == "rule") {
      c->spec.rule = value;
    } else if (key == "multi_precision") {
      c->spec.multi_precision = value == "1" || value == "true";
    } else if (key == "dtype") {
      absl::StatusOr<DType> d = ParseDType(value);
      if (!d.ok()) return d.status();
      c->dtype = *d;
    } else if (key == "count") {
      s = ParseNumber(value, &c->count);
    } else if (key == "steps") {
      s = ParseNumber(value, &c->steps);
    } else if (key == "partitions") {
      s = ParseNumber(value, &c->partitions);
    } else if (key == "lr_mult") {
      s = ParseNumber(value, &c->lr_mult);
    } else if (key == "wd_mult") {
      s = ParseNumber(value, &c->wd_mult);
    } else if (key == "schedule") {
      absl::StatusOr<LrScheduleKind> k = ParseLrScheduleKind(value);
      if (!k.ok()) return k.status();
      c->spec.schedule.kind = *k;
    } else if (key.rfind("schedule.", 0) == 0) {
      s = SetScheduleField(&c->spec.schedule, key.substr(9), value);
    } else {
      return Bad(absl::StrCat("unknown key '", key, "'"));
    }
    if (!s.ok()) return s;
  }
  if (c->count == 0 || c->steps <= 0 || c->partitions == 0 || c->partitions > c->count) {
    return Bad("count, steps > 0 and 1 <= partitions <= count required");
  }
  return absl::OkStatus();
}

absl::Status ReadFloats(const std::string& path, size_t n, std::vector<float>* out) {
  out->resize(n);
  std::ifstream in(path, std::ios::binary);
  if (!in.read(reinterpret_cast<char*>(out->data()), static_cast<std::streamsize>(n * 4)) ||
      in.peek() != EOF) {
    return Bad(absl::StrCat(path, ": expected exactly ", n, " float32"));
  }
  return absl::OkStatus();
}

absl::Status Run(const std::vector<std::string>& args) {
  if (args.size() != 4) return Bad("usage: hybridps-optimizer-check SPEC WEIGHTS GRADS OUT");
  CheckSpec c;
  if (absl::Status s = ParseSpec(args[0], &c); !s.ok()) return s;
  absl::StatusOr<std::unique_ptr<UpdateRule>> made = MakeUpdateRule(c.spec);
  if (!made.ok()) return made.status();
  const UpdateRule& rule = **made;
  if (!UpdateRule::SupportsDType(c.dtype)) return Bad("dtype must be float32/16 or bfloat16");
  std::vector<float> w0;
  std::vector<float> grads;
  if (absl::Status s = ReadFloats(args[1], c.count, &w0); !s.ok()) return s;
  if (absl::Status s = ReadFloats(args[2], c.count * c.steps, &grads); !s.ok()) return s;

  testing::OwnedTensor x(c.dtype, c.count, rule.Layout(c.dtype).num_buffers());
  for (size_t i = 0; i < c.count; ++i) x.set_weight(i, w0[i]);
  std::vector<Partition> parts;
  for (size_t j = 0; j < c.partitions; ++j) {
    const size_t a = c.count * j / c.partitions;
    const size_t b = c.count * (j + 1) / c.partitions;
    parts.push_back(x.View(a, b - a));
    if (absl::Status s = rule.InitState(parts.back()); !s.ok()) return s;
  }
  std::vector<float> out(c.count * c.steps);
  for (int64_t t = 1; t <= c.steps; ++t) {
    for (size_t i = 0; i < c.count; ++i) x.set_grad(i, grads[(t - 1) * c.count + i]);
    const StepArgs step = rule.Step(t, t, c.lr_mult, c.wd_mult);
    NormPartials total;
    if (rule.needs_tensor_norms()) {
      for (const Partition& p : parts) {
        absl::StatusOr<NormPartials> mine = rule.Prepare(p, step);
        if (!mine.ok()) return mine.status();
        total += *mine;
      }
    }
    const TensorNorms norms = FinishNorms(total);
    for (const Partition& p : parts) {
      if (absl::Status s = rule.Apply(p, step, norms); !s.ok()) return s;
    }
    for (size_t i = 0; i < c.count; ++i) out[(t - 1) * c.count + i] = x.weight(i);
  }
  std::ofstream o(args[3], std::ios::binary);
  if (!o.write(reinterpret_cast<const char*>(out.data()),
               static_cast<std::streamsize>(out.size() * 4))) {
    return Bad(absl::StrCat("cannot write ", args[3]));
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace optimizers
}  // namespace hybridps

int main(int argc, char** argv) {
  const absl::Status s = hybridps::optimizers::Run(std::vector<std::string>(argv + 1, argv + argc));
  if (!s.ok()) {
    std::cerr << "hybridps-optimizer-check: " << s.message() << "\n";
    return 1;
  }
  return 0;
}
