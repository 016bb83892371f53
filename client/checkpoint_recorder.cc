#include "client/checkpoint_recorder.h"

#include "runtime/common/status_macros.h"

namespace zerod::client {

v1::CheckpointRecord ToProto(const checkpoint::CheckpointRecordInfo& record,
                             const std::string& job_id) {
  v1::CheckpointRecord out;
  out.set_job_id(job_id);
  out.set_step(record.step);
  out.set_directory(record.directory);
  out.set_world_size(record.world_size);
  out.set_stage(record.stage);
  out.set_bytes(record.bytes);
  out.set_manifest_xxh3(record.manifest_xxh3);
  switch (record.state) {
    case checkpoint::RecordState::kSaving:
      out.set_state(v1::CHECKPOINT_SAVING);
      break;
    case checkpoint::RecordState::kComplete:
      out.set_state(v1::CHECKPOINT_COMPLETE);
      break;
    case checkpoint::RecordState::kRemoved:
      out.set_state(v1::CHECKPOINT_REMOVED);
      break;
    case checkpoint::RecordState::kSetAside:
      out.set_state(v1::CHECKPOINT_SET_ASIDE);
      break;
  }
  return out;
}

checkpoint::CheckpointRecordInfo FromProto(const v1::CheckpointRecord& record) {
  checkpoint::CheckpointRecordInfo out;
  out.step = record.step();
  out.directory = record.directory();
  out.world_size = record.world_size();
  out.stage = record.stage();
  out.bytes = record.bytes();
  out.manifest_xxh3 = record.manifest_xxh3();
  switch (record.state()) {
    case v1::CHECKPOINT_COMPLETE:
      out.state = checkpoint::RecordState::kComplete;
      break;
    case v1::CHECKPOINT_REMOVED:
      out.state = checkpoint::RecordState::kRemoved;
      break;
    case v1::CHECKPOINT_SET_ASIDE:
      out.state = checkpoint::RecordState::kSetAside;
      break;
    default:  // saving, or a state this client does not know: never loaded
      out.state = checkpoint::RecordState::kSaving;
      break;
  }
  return out;
}

absl::Status CheckpointRecorder::Record(const checkpoint::CheckpointRecordInfo& record) {
  return client_->RecordCheckpoint(ToProto(record, job_id_)).status();
}

absl::StatusOr<std::vector<checkpoint::CheckpointRecordInfo>> CheckpointRecorder::List() {
  ZEROD_ASSIGN_OR_RETURN(std::vector<v1::CheckpointRecord> records,
                         client_->ListCheckpoints(job_id_));
  std::vector<checkpoint::CheckpointRecordInfo> out;
  out.reserve(records.size());
  for (const v1::CheckpointRecord& r : records) out.push_back(FromProto(r));
  return out;
}

}  // namespace zerod::client
