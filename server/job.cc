#include "server/job.h"

namespace zerod::server {

bool IsLive(const Member& member) {
  return member.state == v1::MEMBER_ACTIVE || member.state == v1::MEMBER_JOINING;
}

Member* MemberAt(Job& job, int64_t rank) {
  auto it = job.members.find(rank);
  return it == job.members.end() ? nullptr : &it->second;
}

const Member* MemberAt(const Job& job, int64_t rank) {
  auto it = job.members.find(rank);
  return it == job.members.end() ? nullptr : &it->second;
}

const char* MemberStateName(v1::MemberState state) {
  switch (state) {
    case v1::MEMBER_JOINING:
      return "joining";
    case v1::MEMBER_ACTIVE:
      return "active";
    case v1::MEMBER_LOST:
      return "lost";
    case v1::MEMBER_LEFT:
      return "left";
    default:
      return "unknown";
  }
}

}  // namespace zerod::server
