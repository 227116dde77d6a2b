// The --device option every model command takes: one description and one set of choices, so that
// `--help` lists the same devices everywhere and a bad value fails while parsing, before a model loads.
#pragma once
#include <CLI/CLI.hpp>
#include <string>

namespace moefold {

/// The devices a model command accepts (`cuda` fails at run time in a binary built without it).
inline const std::vector<std::string> kDeviceChoices = {"cpu", "cuda"};

/// Gives `device` (an already added --device option) the shared description and the check that its
/// value is one of kDeviceChoices. Returns `device`.
inline CLI::Option* device_choices(CLI::Option* device) {
  return device->description("cpu | cuda (cuda needs a binary built with the CUDA backend)")
      ->check(CLI::IsMember(kDeviceChoices));
}

}  // namespace moefold
