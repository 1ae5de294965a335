#include "server/rpc/admin_service.h"

#include <cstdio>

#include "server/rpc/grpc_status.h"

namespace tidemark::server {

grpc::Status AdminService::CreateToken(grpc::ServerContext* ctx,
                                       const v1::CreateTokenRequest* request,
                                       v1::CreateTokenResponse* response) {
  auto admin = m_access.administrator(*ctx, "CreateToken");
  if (!admin.ok()) return toGrpc(admin.status());
  if (request->role() != v1::TOKEN_ROLE_INGEST && request->role() != v1::TOKEN_ROLE_READ &&
      request->role() != v1::TOKEN_ROLE_CONTROL) {
    return toGrpc(absl::InvalidArgumentError("a token's role is ingest, read or control"));
  }
  if (request->name().size() > 256) {
    return toGrpc(absl::InvalidArgumentError("a token's name is at most 256 bytes"));
  }
  const uid_t uid = request->has_uid() ? request->uid() : *admin;
  auto made = m_tokens.create(request->role(), request->name(), uid);
  if (!made.ok()) return toGrpc(made.status());
  std::fprintf(stderr, "tidemarkd: token %lld (%s, uid %u) created by uid %u\n",
               static_cast<long long>(made->first), request->name().c_str(), uid, *admin);
  response->set_id(static_cast<uint64_t>(made->first));
  response->set_token(made->second);
  return grpc::Status::OK;
}

grpc::Status AdminService::ListTokens(grpc::ServerContext* ctx, const v1::ListTokensRequest*,
                                      v1::ListTokensResponse* response) {
  auto admin = m_access.administrator(*ctx, "ListTokens");
  if (!admin.ok()) return toGrpc(admin.status());
  auto rows = m_tokens.list();
  if (!rows.ok()) return toGrpc(rows.status());
  for (const TokenRow& t : *rows) {
    v1::TokenInfo* info = response->add_tokens();
    info->set_id(static_cast<uint64_t>(t.id));
    info->set_name(t.name);
    info->set_role(static_cast<v1::TokenRole>(t.role));
    info->set_uid(static_cast<uint32_t>(t.uid));
    info->set_created_wall_ns(t.createdWallNs);
    info->set_revoked(t.revoked);
  }
  return grpc::Status::OK;
}

grpc::Status AdminService::RevokeToken(grpc::ServerContext* ctx,
                                       const v1::RevokeTokenRequest* request,
                                       v1::RevokeTokenResponse*) {
  auto admin = m_access.administrator(*ctx, "RevokeToken");
  if (!admin.ok()) return toGrpc(admin.status());
  if (auto s = m_tokens.revoke(static_cast<int64_t>(request->id())); !s.ok()) return toGrpc(s);
  std::fprintf(stderr, "tidemarkd: token %llu revoked by uid %u\n",
               static_cast<unsigned long long>(request->id()), *admin);
  return grpc::Status::OK;
}

}  // namespace tidemark::server
