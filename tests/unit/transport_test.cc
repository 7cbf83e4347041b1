// The address a dist_allreduce worker gives its Gloo peers (common/transport.h): this
// host's name resolved here, never handed to Gloo unresolved (Gloo crashes on some names
// that have no address of this host).
#include "common/transport.h"

#include <gtest/gtest.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>

#include <string>

#include "absl/strings/match.h"

namespace hybridps {
namespace {

TEST(LocalAddressOfTest, ANameThatDoesNotResolveIsAnErrorNamingIt) {
  bool loopback = true;
  absl::StatusOr<std::string> a = LocalAddressOf("no-such-host.invalid", &loopback);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(a.status().message(), "'no-such-host.invalid' does not resolve"))
      << a.status();
}

TEST(LocalAddressOfTest, AnAddressOfAnotherHostIsAnErrorNamingIt) {
  // Reserved (240/4): never an address of a host.
  absl::StatusOr<std::string> a = LocalAddressOf("240.0.0.7", nullptr);
  ASSERT_FALSE(a.ok());
  EXPECT_TRUE(absl::StrContains(a.status().message(),
                                "resolves to 240.0.0.7, none of them an address of this host"))
      << a.status();
}

TEST(LocalAddressOfTest, LoopbackIsTakenButSaidToBeLoopback) {
  bool loopback = false;
  absl::StatusOr<std::string> a = LocalAddressOf("127.0.0.1", &loopback);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(*a, "127.0.0.1");
  EXPECT_TRUE(loopback);
}

// Every non-loopback IPv4 address of this machine's interfaces is taken as it is.
TEST(LocalAddressOfTest, AnAddressOfThisHostIsTakenAsItIs) {
  ifaddrs* list = nullptr;
  ASSERT_EQ(getifaddrs(&list), 0);
  int checked = 0;
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    char text[64] = {0};
    ASSERT_EQ(getnameinfo(i->ifa_addr, sizeof(sockaddr_in), text, sizeof text, nullptr, 0,
                          NI_NUMERICHOST),
              0);
    bool loopback = true;
    absl::StatusOr<std::string> a = LocalAddressOf(text, &loopback);
    ASSERT_TRUE(a.ok()) << text << ": " << a.status();
    EXPECT_EQ(*a, text);
    EXPECT_EQ(loopback, absl::StartsWith(text, "127.")) << text;
    ++checked;
  }
  freeifaddrs(list);
  EXPECT_GE(checked, 1);  // loopback at least
}

}  // namespace
}  // namespace hybridps
