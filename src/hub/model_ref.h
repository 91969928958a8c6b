// What `-m` / `-hf` name: a file, an official checkpoint (`Qwen3.6-27B[:QUANT]`), or a GGUF repo
// on the hub (`ORG/NAME[:FILE or :QUANT]`), and which file of a repo a quant selects.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "model/identity.h"

namespace qwenrt::hub {

// The official checkpoints' GGUF repos: the one table (see docs/decisions.md on its names).
struct OfficialRepo {
  model::Checkpoint checkpoint;
  std::string name;  // "Qwen3.6-27B" (model/identity's registry name)
  std::string repo;  // "ggml-org/Qwen3.6-27B-GGUF"
  std::string file(const std::string& quant) const;  // "Qwen3.6-27B-Q4_K_M.gguf"
};
const std::vector<OfficialRepo>& official_repos();
const OfficialRepo* official_repo(std::string_view name);  // exact, case-sensitive

inline constexpr const char* kDefaultQuant = "Q4_K_M";

struct ModelRef {
  std::string asked;  // the text as given, for messages
  bool is_path = false;
  std::string path;  // is_path
  std::string repo;  // otherwise: the repo
  std::string revision = "main";
  std::string file;   // the file in it, when named or known
  std::string quant;  // when the file is to be chosen by quant ("Q4_K_M", upper case)
  std::optional<model::Checkpoint> official;  // when named by an official name
};

// `-m TEXT` (hub_only false: an existing file wins, and a name ending in .gguf is a path) or
// `-hf TEXT` (hub_only true). Errors name the text and what it could have been.
ModelRef parse_model_ref(const std::string& text, bool hub_only);

enum class SidecarKind { kMtp, kDflash };
const char* sidecar_prefix(SidecarKind kind);  // "mtp-", "dflash-"

// The file's kind by its base name: trunk, a drafter sidecar or a vision projector.
enum class FileRole { kTrunk, kMtp, kDflash, kMmproj };
FileRole file_role(const std::string& file);

// The GGUF among `files` (repo paths) that `quant` selects for a trunk: its name holds the quant
// as a whole token (Q4_K_M in "x-Q4_K_M.gguf", not in "x-UD-Q4_K_M_L.gguf"), mmproj / mtp / dflash
// files never; of a split GGUF, its first part (every part must be listed). Error naming the repo
// and the quants it has when none or several match.
std::string choose_quant_file(const std::string& repo, const std::vector<std::string>& files,
                              const std::string& quant);
// The sidecar of `kind` among `files` for a trunk of quant `quant` (same quant preferred, else
// the only one); nullopt when the repo has none. Error when several fit equally.
std::optional<std::string> choose_sidecar_file(const std::string& repo,
                                               const std::vector<std::string>& files,
                                               SidecarKind kind, const std::string& quant);
// The quant token in a file name ("Q4_K_M" of "Qwen3.6-27B-Q4_K_M.gguf"), empty if none.
std::string quant_of(const std::string& file);

}  // namespace qwenrt::hub
