// Internal to optimizers/: the float an MXNet 1.9.1 operator actually receives for a
// Python float keyword argument.
//
// MXNet's Python front end passes operator kwargs as strings, str(value), and dmlc-core
// parses float parameter fields with its own fast dmlc::stof (include/dmlc/strtonum.h),
// which is not correctly rounded: for about 9% of doubles (e.g. a bias-corrected Adam
// learning rate) the operator's float is one ulp away from (float)value. The rules pass
// their kwargs through MxnetKwargFloat so that their float scalars, and hence their
// results, equal MXNet's bit for bit. Values MXNet hands over in a tuple kwarg or an
// NDArray (multi_sgd's lrs/wds, multi_lamb's learning_rates/wds, LARS's lrs/wds, AdamW's
// rescale_grad) are correctly rounded and must not go through it.
#ifndef HYBRIDPS_OPTIMIZERS_MXNET_FLOAT_H_
#define HYBRIDPS_OPTIMIZERS_MXNET_FLOAT_H_

#include <string>

namespace hybridps {
namespace optimizers {
namespace internal {

// Python 3's repr(float): the shortest round-trip digits, in exponent form when the
// decimal exponent is < -4 or >= 16 ("1e-05", "7.7e-05", "1e+16"), else fixed ("0.0001",
// "100.0").
std::string PythonFloatRepr(double v);

// dmlc::stof(PythonFloatRepr(v)).
float MxnetKwargFloat(double v);

}  // namespace internal
}  // namespace optimizers
}  // namespace hybridps

#endif  // HYBRIDPS_OPTIMIZERS_MXNET_FLOAT_H_
