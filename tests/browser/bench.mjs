// What the page's benchmark scripts (first_step.mjs, story_run.mjs, calibrate_page.mjs) share:
// the served page's URL from the command line, and Debian's Chromium with WebGPU on SwiftShader,
// as the tests run it.
import { chromium } from 'playwright-core';

/** The URL argument (and the rest), or the usage line and exit 2. */
export function args(usage) {
  const rest = process.argv.slice(2);
  if (!rest[0]) {
    console.error(`usage: ${usage}`);
    process.exit(2);
  }
  return rest;
}

export function launch() {
  return chromium.launch({
    executablePath: process.env.SHARDLAB_CHROMIUM || '/usr/bin/chromium',
    args: ['--no-sandbox', '--disable-background-networking', '--disable-component-update', '--disable-sync',
      '--disable-quic', '--enable-unsafe-webgpu', '--use-webgpu-adapter=swiftshader'],
  });
}
