#ifndef ZEROD_CLIENT_CHECKPOINT_RECORDER_H_
#define ZEROD_CLIENT_CHECKPOINT_RECORDER_H_

// The coordinator's durable record of a job's checkpoints, as runtime/checkpoint sees it
// (checkpoint::Recorder): records converted to and from v1::CheckpointRecord, the job filled in.
// The session gives it to Save and Load on rank 0.

#include <memory>
#include <string>
#include <vector>

#include "client/coordinator_client.h"
#include "runtime/checkpoint/save_protocol.h"

namespace zerod::client {

class CheckpointRecorder final : public checkpoint::Recorder {
 public:
  CheckpointRecorder(std::shared_ptr<CoordinatorClient> client, std::string job_id)
      : client_(std::move(client)), job_id_(std::move(job_id)) {}

  absl::Status Record(const checkpoint::CheckpointRecordInfo& record) override;
  absl::StatusOr<std::vector<checkpoint::CheckpointRecordInfo>> List() override;
  const std::string& job_id() const override { return job_id_; }

 private:
  const std::shared_ptr<CoordinatorClient> client_;
  const std::string job_id_;
};

v1::CheckpointRecord ToProto(const checkpoint::CheckpointRecordInfo& record,
                             const std::string& job_id);
checkpoint::CheckpointRecordInfo FromProto(const v1::CheckpointRecord& record);

}  // namespace zerod::client

#endif  // ZEROD_CLIENT_CHECKPOINT_RECORDER_H_
