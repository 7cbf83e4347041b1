#include "absl/strings/match.h"
#include "common/wire.h"
#include "common/compression.h"
#include "common/dtype.h"
#include "tests/status_matchers.h"
#include "absl/strings/str_cat.h"
#include "common/auth.h"
#include "common/version.h"

#include <gtest/gtest.h>

#include <vector>

namespace hybridps {
namespace {

wire::Envelope DataEnv(uint64_t count, uint32_t dtype = 0) {
  wire::Envelope env;
  env.set_id(7);
  auto* r = env.mutable_data_request();
  r->set_key(42);
  r->set_part(1);
  r->set_round(3);
  r->set_op(wire::OP_PUSHPULL);
  r->set_dtype(dtype);
  r->set_count(count);
  r->set_total_count(count);
  r->set_name("w");
  return env;
}

TEST(Wire, RoundTripWithPayload) {
  std::vector<float> data = {1, 2, 3};
  Message m = Encode("peer", DataEnv(3), Frame(absl::string_view(
                                             reinterpret_cast<char*>(data.data()), 12)));
  ASSERT_EQ(m.size(), 3u);
  auto d = Decode(std::move(m), /*from_router=*/true);
  ASSERT_OK(d);
  EXPECT_EQ(d->peer, "peer");
  EXPECT_EQ(d->env.id(), 7u);
  EXPECT_EQ(d->env.data_request().key(), 42u);
  ASSERT_TRUE(d->payload.has_value());
  EXPECT_EQ(d->payload->size(), 12u);
  EXPECT_OK(ValidateDataRequest(d->env.data_request(), d->payload));
}

TEST(Wire, RejectsMalformedMessages) {
  {  // No frames at all after the routing id.
    Message m;
    m.emplace_back("peer");
    EXPECT_FALSE(Decode(std::move(m), true).ok());
  }
  {  // Garbage instead of an envelope.
    Message m;
    m.emplace_back("\xff\xff\xff\xff garbage");
    auto d = Decode(std::move(m), false);
    ASSERT_FALSE(d.ok());
    EXPECT_NE(d.status().message().find("malformed"), absl::string_view::npos);
  }
  {  // Too many frames.
    Message m = Encode("", DataEnv(0));
    m.emplace_back("a");
    m.emplace_back("b");
    EXPECT_FALSE(Decode(std::move(m), false).ok());
  }
  {  // A valid protobuf with no body.
    wire::Envelope env;
    env.set_id(1);
    EXPECT_FALSE(Decode(Encode("", env), false).ok());
  }
  {  // Truncated envelope.
    Message m = Encode("", DataEnv(5));
    std::string bytes(m[0].view());
    Message t;
    t.emplace_back(absl::string_view(bytes.data(), bytes.size() / 2));
    EXPECT_FALSE(Decode(std::move(t), false).ok());
  }
  {  // Empty message.
    EXPECT_FALSE(Decode(Message{}, true).ok());
  }
}

TEST(Wire, ValidatesPayloadAgainstHeader) {
  auto env = DataEnv(4);
  std::optional<Frame> none;
  EXPECT_FALSE(ValidateDataRequest(env.data_request(), none).ok());  // push without data
  std::optional<Frame> shortp(Frame(std::string(15, 'x')));
  auto s = ValidateDataRequest(env.data_request(), shortp);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("15 bytes"), absl::string_view::npos) << s;
  std::optional<Frame> ok(Frame(std::string(16, 'x')));
  EXPECT_OK(ValidateDataRequest(env.data_request(), ok));
  auto bad_dtype = DataEnv(4, 99);
  EXPECT_FALSE(ValidateDataRequest(bad_dtype.data_request(), ok).ok());
  auto overflow = DataEnv(~0ull);
  EXPECT_FALSE(ValidateDataRequest(overflow.data_request(), ok).ok());
  auto bad_op = DataEnv(4);
  bad_op.mutable_data_request()->set_op(static_cast<wire::DataOp>(17));
  EXPECT_FALSE(ValidateDataRequest(bad_op.data_request(), ok).ok());
  auto bcast = DataEnv(4);
  bcast.mutable_data_request()->set_op(wire::OP_BROADCAST);
  EXPECT_OK(ValidateDataRequest(bcast.data_request(), none));  // non-root: no data
}

TEST(Wire, ACompressedPushCarriesItsPackedSize) {
  auto env = DataEnv(20);  // 20 float32 elements: 8 bytes packed
  auto* r = env.mutable_data_request();
  r->set_compression(static_cast<uint32_t>(Compression::kTwoBit));
  r->set_threshold(0.5f);
  std::optional<Frame> packed(Frame(std::string(8, '\0')));
  EXPECT_OK(ValidateDataRequest(*r, packed));
  std::optional<Frame> plain(Frame(std::string(80, '\0')));
  auto s = ValidateDataRequest(*r, plain);
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(absl::StrContains(s.message(), "2bit")) << s;
  r->set_threshold(0.0f);
  EXPECT_FALSE(ValidateDataRequest(*r, packed).ok());
  r->set_threshold(0.5f);
  r->set_compression(9);
  s = ValidateDataRequest(*r, packed);
  EXPECT_TRUE(absl::StrContains(s.message(), "unknown compression 9")) << s;
  r->set_compression(static_cast<uint32_t>(Compression::kTwoBit));
  r->set_dtype(static_cast<uint32_t>(DType::kFloat64));
  EXPECT_FALSE(ValidateDataRequest(*r, packed).ok());
  r->set_dtype(static_cast<uint32_t>(DType::kFloat32));
  r->set_op(wire::OP_BROADCAST);
  EXPECT_FALSE(ValidateDataRequest(*r, packed).ok());
}

TEST(Wire, ShapesFromTheNetworkAreChecked) {
  auto env = DataEnv(6);
  auto* r = env.mutable_data_request();
  std::optional<Frame> data(Frame(std::string(24, '\0')));
  for (int64_t d : {2, 3}) r->add_shape(d);
  EXPECT_OK(ValidateDataRequest(*r, data));
  r->set_shape(1, 4);  // (2, 4) for 6 elements
  auto s = ValidateDataRequest(*r, data);
  EXPECT_TRUE(absl::StrContains(s.message(), "does not hold 6")) << s;
  r->set_shape(1, -3);
  EXPECT_FALSE(ValidateDataRequest(*r, data).ok());
  r->clear_shape();
  for (int i = 0; i < 9; ++i) r->add_shape(1);
  s = ValidateDataRequest(*r, data);
  EXPECT_TRUE(absl::StrContains(s.message(), "9 dimensions")) << s;
  r->clear_shape();  // products that overflow are refused, not wrapped
  for (int64_t d : {int64_t{1} << 40, int64_t{1} << 40, int64_t{1} << 40}) r->add_shape(d);
  EXPECT_FALSE(ValidateDataRequest(*r, data).ok());
}

TEST(Wire, HelloChecksMagicAndVersion) {
  constexpr absl::string_view kMe = "the scheduler";
  auto hello = MakeHello(wire::ROLE_WORKER, 3);
  hello.mutable_hello()->set_nonce(std::string(32, 'n'));
  EXPECT_OK(CheckHello(hello.hello(), kMe));
  EXPECT_EQ(hello.hello().rank(), 3);
  auto bad = hello;
  bad.mutable_hello()->set_magic(0x12345678);
  EXPECT_NE(CheckHello(bad.hello(), kMe).message().find("magic"), absl::string_view::npos);
  bad = hello;
  bad.mutable_hello()->set_version(kProtocolVersion + 1);
  EXPECT_NE(CheckHello(bad.hello(), kMe).message().find("version"), absl::string_view::npos);
  bad = hello;
  bad.mutable_hello()->set_software_version("0.0.1-other");
  EXPECT_EQ(CheckHello(bad.hello(), kMe).message(),
            absl::StrCat("hybridps versions differ: the scheduler runs ", Version(),
                         ", the connecting worker runs 0.0.1-other; every process of a job "
                         "must run the same version (install the same one on every host)"));
  bad.mutable_hello()->clear_software_version();
  EXPECT_NE(CheckHello(bad.hello(), kMe).message().find("an unknown version (before"),
            absl::string_view::npos);
  bad = hello;
  bad.mutable_hello()->set_nonce(std::string(1 << 20, 'n'));  // never hashed
  EXPECT_NE(CheckHello(bad.hello(), kMe).message().find("1048576-byte nonce"),
            absl::string_view::npos);
}

TEST(Wire, ErrorsRoundTrip) {
  auto env = MakeError(9, absl::InvalidArgumentError("tensor 'w' mismatched"));
  EXPECT_EQ(env.id(), 9u);
  absl::Status s = FromWire(env.error());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "tensor 'w' mismatched");
  wire::Error ok_code;  // An error that claims OK is still an error.
  EXPECT_FALSE(FromWire(ok_code).ok());
}

TEST(Handshake, AServerOfAnotherVersionIsRefusedByTheClient) {
  const JobKey key("token");
  const ClientHandshake client(key, wire::ROLE_WORKER, 0);
  const Gatekeeper gate(key);
  wire::Envelope ack = gate.Challenge("peer", client.Hello().hello());
  EXPECT_EQ(ack.hello_ack().software_version(), Version());
  EXPECT_OK(client.Answer(ack.hello_ack(), "server 0").status());
  ack.mutable_hello_ack()->set_software_version("7.7.7");
  EXPECT_EQ(client.Answer(ack.hello_ack(), "server 0").status().message(),
            absl::StrCat("hybridps versions differ: this worker runs ", Version(),
                         ", server 0 runs 7.7.7; every process of a job must run the same "
                         "version (install the same one on every host)"));
}

}  // namespace
}  // namespace hybridps
